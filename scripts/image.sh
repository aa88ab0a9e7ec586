#!/usr/bin/env bash
# image.sh - build the two container images with Debian's podman, no registry needed:
#
#   rbd-provisioner:latest        the controller (deploy/deployment.yaml), runs as 65532:65532
#   rbd-provisioner-node:latest   the CSI node plugin (deploy/csi/node.yaml), root, privileged
#
#   scripts/image.sh [--suite sid|bookworm] [--save DIR] [--format docker-archive|oci-archive]
#   scripts/image.sh [--suite sid|bookworm] --base-only    (makes the base; prints its image name)
#   scripts/image.sh run [PODMAN-RUN-OPTIONS] IMAGE [ARGS...]
#
# Which Ceph client: the suite's. `sid` (the default) ships Debian sid's 20.2 client, the only
# Debian client that reads the `aes256k` cephx keys Ceph 20.2 and 19.2.6+ make by default, so the
# images talk to every supported release with its defaults; `bookworm` ships Debian 12's Ceph
# 16.2 client, the one this Debian 12 host builds and tests against (README, "Container images",
# says what is and is not tested of each).
#
# The binary is not compiled inside the image build: no Rust toolchain can be fetched into a
# container here. It is a release build made against the image's own suite, then copied in:
#   bookworm  built by the host's cargo on this Debian 12 host: target/release/rbd-provisioner
#   sid       built by `scripts/in-release-root.sh tentacle-dev` (a chroot of sid with its
#             librados/librbd development files, the host's cargo bound in):
#             target/ceph-tentacle-dev/release/rbd-provisioner
# so the binary finds the same glibc and Ceph libraries (sonames and symbol versions) in the image
# as where it was linked. BINARY=PATH uses a binary built elsewhere against that suite (the tests
# give the debug build their run already made; its debug information is stripped here).
#
# The base is Debian's own packages: `debootstrap --variant=minbase SUITE` (without documentation,
# manual pages and locales, as Debian's slim images), kept under IMAGE_CACHE (default
# /var/cache/rbd-provisioner/image-base-SUITE) and reused while complete, imported into podman as
# localhost/rbd-provisioner-base:SUITE. The Dockerfile then installs each role's packages onto
# it (the build uses the host's network for apt) and copies the binary in.
#
# `--save DIR` writes DIR/rbd-provisioner.tar and DIR/rbd-provisioner-node.tar (docker-archive by
# default: `docker load`, `ctr -n k8s.io images import`, `kind load image-archive`), named
# docker.io/library/rbd-provisioner:latest and docker.io/library/rbd-provisioner-node:latest,
# which is what a container runtime makes of the manifests' unqualified names.
#
# `run` starts an image with the host's network and this machine's container settings
# (the tests use it): runc where crun cannot start containers (cgroup v1 + v2 hybrid hosts), and
# open-file and process limits no higher than this process's own, which an unprivileged-resource
# sandbox cannot raise.
set -euo pipefail
WS=$(realpath "$(dirname "$0")/..")
CACHE=${IMAGE_CACHE:-/var/cache/rbd-provisioner}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "image.sh: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman missing (scripts/install-deps.sh installs it)"

# podman options every container start and build here needs
RUNTIME_OPTS=()
if command -v runc >/dev/null && grep -q '^cgroup /sys/fs/cgroup/' /proc/mounts &&
   grep -q '^cgroup2 /sys/fs/cgroup/unified ' /proc/mounts; then
  RUNTIME_OPTS+=(--runtime runc)
fi
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
LIMIT_OPTS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=4096:4096")

if [ "${1:-}" = run ]; then
  shift
  exec podman "${RUNTIME_OPTS[@]}" run --rm --network=host "${LIMIT_OPTS[@]}" "$@"
fi

SUITE=sid SAVE="" FORMAT=docker-archive BASE_ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=${2:?--suite needs sid or bookworm}; shift 2 ;;
    --save) SAVE=${2:?--save needs a folder}; shift 2 ;;
    --format) FORMAT=${2:?--format needs docker-archive or oci-archive}; shift 2 ;;
    --base-only) BASE_ONLY=1; shift ;;
    *) die "unknown argument $1 (--suite sid|bookworm, --save DIR, --format docker-archive|oci-archive, --base-only)" ;;
  esac
done
case "$FORMAT" in docker-archive|oci-archive) ;; *) die "--format: $FORMAT is neither docker-archive nor oci-archive" ;; esac

# the binary
case "$SUITE" in sid|bookworm) ;; *) die "--suite: $SUITE is neither sid nor bookworm" ;; esac
# Debian unstable's Release file can outlive its Valid-Until on a mirror that lags (seen here: apt
# refuses it); its signature is still checked. Only the build's apt runs with this.
APT_OPTS=""
[ "$SUITE" = sid ] && APT_OPTS="-o Acquire::Check-Valid-Until=false"
[ -n "$BASE_ONLY" ] && BINARY=none
case "$SUITE" in
  sid)
    if [ -z "${BINARY:-}" ]; then
      "$WS/scripts/in-release-root.sh" tentacle-dev cargo build --release --locked -p rbd-provisioner >&2
      BINARY=$WS/target/ceph-tentacle-dev/release/rbd-provisioner
    fi ;;
  bookworm)
    if [ -z "${BINARY:-}" ]; then
      # shellcheck disable=SC1091
      codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
      [ "$codename" = bookworm ] || die "--suite bookworm copies the host's build, and this host is ${codename:-not Debian}, not bookworm (BINARY=PATH names a bookworm build)"
      (cd "$WS" && cargo build --release --locked -p rbd-provisioner >&2)
      BINARY=$WS/target/release/rbd-provisioner
    fi ;;
esac
[ -n "$BASE_ONLY" ] || [ -x "$BINARY" ] || die "no binary at $BINARY"

# the base: debootstrap once, import once per base
ROOT=$CACHE/image-base-$SUITE
if [ ! -f "$ROOT/.complete" ]; then
  command -v debootstrap >/dev/null || die "debootstrap missing (scripts/install-deps.sh installs it)"
  mkdir -p "$CACHE"
  PARTIAL=$ROOT.partial
  rm -rf --one-file-system "$ROOT" "$PARTIAL"
  echo "image.sh: debootstrap $SUITE into $ROOT" >&2
  LOG=$CACHE/image-base-$SUITE.log
  debootstrap --variant=minbase "$SUITE" "$PARTIAL" "$MIRROR" >"$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
  if [ "$SUITE" = bookworm ]; then
    # the point-release updates and security fixes the host has too
    cat >"$PARTIAL/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  fi
  # as Debian's slim images: no documentation, manual pages or translations, now or later
  cat >"$PARTIAL/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$PARTIAL/etc/apt/apt.conf.d/no-recommends"
  chroot "$PARTIAL" env DEBIAN_FRONTEND=noninteractive sh -c \
    "apt-get $APT_OPTS update -qq && apt-get -y -qq upgrade" >>"$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
  chroot "$PARTIAL" apt-get clean
  find "$PARTIAL/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$PARTIAL/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$PARTIAL"/usr/share/man/* "$PARTIAL"/usr/share/info/* "$PARTIAL"/usr/share/locale/* \
    "$PARTIAL"/var/lib/apt/lists/* "$PARTIAL"/var/cache/apt/*.bin "$PARTIAL"/var/log/*.log \
    "$PARTIAL"/var/cache/debconf/*-old
  touch "$PARTIAL/.complete"
  mv "$PARTIAL" "$ROOT"
fi
# tagged with the base's date, so a new debootstrap is imported again
BASE=localhost/rbd-provisioner-base:$SUITE-$(date -u -r "$ROOT/.complete" +%Y%m%d%H%M%S)
if ! podman image exists "$BASE"; then
  echo "image.sh: importing $ROOT as $BASE" >&2
  tar -C "$ROOT" --exclude=./.complete --numeric-owner -c . | podman import --quiet - "$BASE" >/dev/null
fi

if [ -n "$BASE_ONLY" ]; then echo "$BASE"; exit 0; fi

# the build: a context with only the binary
CONTEXT=$(mktemp -d)
trap 'rm -rf "$CONTEXT"' EXIT
cp "$BINARY" "$CONTEXT/rbd-provisioner"
# no debug information in an image (a debug build given as BINARY is mostly that)
strip --strip-debug "$CONTEXT/rbd-provisioner"
for target in provisioner node; do
  name=rbd-provisioner
  [ "$target" = node ] && name=rbd-provisioner-node
  echo "image.sh: building $name:latest ($SUITE)" >&2
  old=$(podman image inspect --format '{{.Id}}' "localhost/$name:latest" 2>/dev/null || true)
  podman "${RUNTIME_OPTS[@]}" build --quiet --pull=never --network=host "${LIMIT_OPTS[@]}" \
    --build-arg "BASE=$BASE" --build-arg "APT_OPTS=$APT_OPTS" --target "$target" -f "$WS/Dockerfile" \
    -t "localhost/$name:latest" -t "docker.io/library/$name:latest" "$CONTEXT" >/dev/null
  version=$(podman "${RUNTIME_OPTS[@]}" run --rm --network=none "${LIMIT_OPTS[@]}" \
    --entrypoint /usr/bin/rbd-provisioner "localhost/$name:latest" --version)
  # the image this build replaced, unless something still uses it
  new=$(podman image inspect --format '{{.Id}}' "localhost/$name:latest")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  size=$(podman image inspect --format '{{.Size}}' "localhost/$name:latest")
  echo "image.sh: $name:latest, $((size / 1000000)) MB: $version" >&2
  if [ -n "$SAVE" ]; then
    mkdir -p "$SAVE"
    rm -f "$SAVE/$name.tar"
    podman save --quiet --format "$FORMAT" -o "$SAVE/$name.tar" "docker.io/library/$name:latest"
    echo "image.sh: saved $SAVE/$name.tar ($FORMAT)" >&2
  fi
done
