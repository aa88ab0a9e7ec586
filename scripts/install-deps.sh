#!/usr/bin/env bash
# install-deps.sh - install every Debian package the build, the tests and the demo need.
# Idempotent: packages already present are skipped, so a second run takes well under a second
# and touches nothing. Runs as root (CI and dev machines are root); uses sudo otherwise.
set -euo pipefail

PKGS=(
  # Ceph daemons for the micro cluster, and the client tools/libraries
  ceph-mon ceph-osd ceph-common python3-rados python3-rbd
  # the second site of the disaster-recovery test bed: RBD mirroring's daemon
  rbd-mirror
  # native access from Rust (bindgen needs libclang)
  librbd-dev librados-dev libclang-dev clang pkg-config
  # node data path without kernel rbd/nbd: rbd-fuse + loop devices + filesystems
  rbd-fuse fuse3 xfsprogs e2fsprogs util-linux mount
  # tests and tools
  jq curl procps iproute2 strace
  # other Ceph releases for the test matrix (scripts/ceph-release.sh)
  debootstrap
  # a real gRPC client (grpcio) for the kubelet-registration tests; AES-GCM (cryptography) for
  # laying out keys as ceph-csi wraps them
  python3-grpcio python3-cryptography
  # the kernel data path in a VM (scripts/vm-run.sh): qemu (TCG), virtme-ng's needs (a static
  # busybox for its initramfs, udev for its virtio-serial ports, kmod), a venv for virtme-ng,
  # and the node's mappers and tools the guest runs from this root filesystem
  qemu-system-x86 busybox-static udev kmod python3-venv rbd-nbd cryptsetup-bin
  # the container images (scripts/image.sh): podman, and runc for hosts where crun cannot start
  # containers (cgroup v1 + v2 hybrid)
  podman runc
  # the real Kubernetes node (scripts/real-cluster.sh): containerd and the CNI plugins its pods'
  # network needs
  containerd containernetworking-plugins
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
# The VM test bed (scripts/vm-run.sh) in VM_CACHE: virtme-ng from PyPI in a venv, and Debian
# bookworm's 6.1 kernel, unpacked, not installed (this host keeps its own kernel). Outside
# /var/cache and /tmp, which the guest replaces with its own tmpfs.
VM_CACHE=${VM_CACHE:-/opt/rbd-provisioner-vm}
VIRTME_NG_VERSION=1.42
# The kernel: what bookworm's linux-image-amd64 depends on now (one 6.1 ABI package; an exact
# version would vanish from the archive with the next security update). KERNEL_PACKAGE pins one.
if [ ! -x "$VM_CACHE/venv/bin/vng" ] ||
   ! ls -d "$VM_CACHE"/venv/lib/python3*/site-packages/virtme_ng-"$VIRTME_NG_VERSION".dist-info >/dev/null 2>&1; then
  echo "install-deps: virtme-ng $VIRTME_NG_VERSION in $VM_CACHE/venv"
  $SUDO mkdir -p "$VM_CACHE"
  $SUDO rm -rf "$VM_CACHE/venv"
  $SUDO /usr/bin/python3 -m venv "$VM_CACHE/venv"
  $SUDO "$VM_CACHE/venv/bin/pip" install -q --disable-pip-version-check \
    "virtme-ng==$VIRTME_NG_VERSION" "argcomplete==3.7.2" "requests==2.34.2"
fi
if ! ls "$VM_CACHE"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
  kpkg=${KERNEL_PACKAGE:-$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-6\.1/ {print $2; exit}')}
  if [ -z "$kpkg" ]; then
    $SUDO apt-get update -qq
    kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6\.1/ {print $2; exit}')
  fi
  [ -n "$kpkg" ] || { echo "install-deps: no linux-image-6.1 package found" >&2; exit 1; }
  echo "install-deps: $kpkg unpacked in $VM_CACHE/kernel"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$kpkg" >/dev/null 2>&1)
  $SUDO rm -rf "$VM_CACHE/kernel.new"
  $SUDO dpkg-deb -x "$tmp"/*.deb "$VM_CACHE/kernel.new"
  kver=$(ls "$VM_CACHE/kernel.new/lib/modules")
  $SUDO depmod -b "$VM_CACHE/kernel.new" "$kver"   # the package ships no modules.dep
  rm -rf "$tmp"
  $SUDO mv "$VM_CACHE/kernel.new" "$VM_CACHE/kernel"
fi
# loop devices for the fuse-loop data path
$SUDO modprobe loop 2>/dev/null || true
echo "install-deps: done"
