#!/usr/bin/env bash
# ceph-release.sh RELEASE - make (once) and print the root filesystem of another Ceph release, for
# `CEPH_ROOT=$(scripts/ceph-release.sh tentacle) scripts/micro-ceph.sh DIR`.
#
#   reef          Debian trixie's Ceph (18.2)
#   tentacle      Debian sid's Ceph (20.2)
#   tentacle-dev  the same plus the client's development files (librados-dev, librbd-dev, libclang,
#                 pkg-config, gcc) and the tools the Ceph-facing tests call: scripts/build-client.sh
#                 builds the product in it, linked with Tentacle's client, and runs the tests there
#
# The root is Debian's own packages (debootstrap minbase, then ceph-mon, ceph-osd, ceph-common:
# about 2 minutes and 1 GB), kept under CEPH_RELEASE_CACHE (default
# /var/cache/rbd-provisioner/ceph-RELEASE) and reused while it is complete. Its daemons never start
# here: micro-ceph.sh runs them chrooted in a private mount namespace.
set -euo pipefail
RELEASE=${1:?usage: ceph-release.sh reef|tentacle|tentacle-dev}
EXTRA=()
case "$RELEASE" in
  reef) SUITE=trixie ;;
  tentacle) SUITE=sid ;;
  tentacle-dev)
    SUITE=sid
    EXTRA=(librados-dev librbd-dev libclang-dev pkg-config gcc libc6-dev
      rbd-fuse rbd-nbd fuse3 e2fsprogs xfsprogs util-linux mount kmod procps strace git ca-certificates) ;;
  *) echo "ceph-release.sh: unknown release $RELEASE (reef, tentacle or tentacle-dev)" >&2; exit 2 ;;
esac
CACHE=${CEPH_RELEASE_CACHE:-/var/cache/rbd-provisioner}
ROOT=$CACHE/ceph-$RELEASE
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# complete = the marker written after the last step
if [ -f "$ROOT/.complete" ]; then
  echo "$ROOT"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "ceph-release.sh: debootstrap missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$CACHE"
PARTIAL=$ROOT.partial
# a failed or killed run leaves nothing mounted and only the .partial folder, removed by the next
cleanup() { if mountpoint -q "$PARTIAL/proc"; then umount -l "$PARTIAL/proc"; fi; }
cleanup
rm -rf --one-file-system "$ROOT" "$PARTIAL"
trap cleanup EXIT
trap 'exit 1' INT TERM
echo "ceph-release.sh: building $RELEASE ($SUITE) in $ROOT" >&2
debootstrap --variant=minbase "$SUITE" "$PARTIAL" "$MIRROR" >"$CACHE/ceph-$RELEASE.log" 2>&1 || {
  tail -20 "$CACHE/ceph-$RELEASE.log" >&2; exit 1; }
# no service may start inside the root while packages install
printf '#!/bin/sh\nexit 101\n' > "$PARTIAL/usr/sbin/policy-rc.d"
chmod +x "$PARTIAL/usr/sbin/policy-rc.d"
mount -t proc proc "$PARTIAL/proc"
# The caller's TMPDIR (scripts/test.sh's private folder) does not exist inside the root: package
# scripts that make temporary files (ca-certificates' mktemp) would fail on it.
chroot "$PARTIAL" env TMPDIR=/tmp DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  ceph-mon ceph-osd ceph-common python3-rados python3-rbd "${EXTRA[@]}" >>"$CACHE/ceph-$RELEASE.log" 2>&1 || {
  tail -20 "$CACHE/ceph-$RELEASE.log" >&2; exit 1; }
chroot "$PARTIAL" env TMPDIR=/tmp apt-get clean
umount "$PARTIAL/proc"
chroot "$PARTIAL" env TMPDIR=/tmp ceph --version >&2
touch "$PARTIAL/.complete"
mv "$PARTIAL" "$ROOT"
echo "$ROOT"
