#!/usr/bin/env bash
# install-deps.sh - install every Debian package the build, the tests and the demo need.
# Idempotent: packages already present are skipped, so a second run takes well under a second
# and touches nothing. Runs as root (CI and dev machines are root); uses sudo otherwise.
set -euo pipefail

PKGS=(
  # Ceph daemons for the micro cluster, and the client tools/libraries
  ceph-mon ceph-osd ceph-common python3-rados python3-rbd
  # native access from Rust (bindgen needs libclang)
  librbd-dev librados-dev libclang-dev clang pkg-config
  # node data path without kernel rbd/nbd: rbd-fuse + loop devices + filesystems
  rbd-fuse fuse3 xfsprogs e2fsprogs util-linux mount
  # tests and tools
  jq curl procps iproute2 strace
  # other Ceph releases for the test matrix (scripts/ceph-release.sh)
  debootstrap
  # a real gRPC client (grpcio) for the kubelet-registration tests
  python3-grpcio
)
# kubectl comes from the Kubernetes apt repo on most machines; use Debian's when it has one.
OPTIONAL=(kubernetes-client)

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v kubectl >/dev/null 2>&1; then
  for p in "${OPTIONAL[@]}"; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null || true
    fi
  done
  command -v kubectl >/dev/null 2>&1 || echo "install-deps: kubectl not available; kubectl tests will be skipped" >&2
fi
# loop devices for the fuse-loop data path
$SUDO modprobe loop 2>/dev/null || true
echo "install-deps: done"
