#!/usr/bin/env bash
# vm-run.sh - run one command inside a throwaway virtual machine with Debian's own kernel, which
# has the rbd, nbd, dm-crypt, ext4 and xfs modules this host's kernel may lack, and return its
# exit status and output.
#
# usage: vm-run.sh --check           exit 0 when everything the VM needs is installed, else 77
#                                    with what is missing (scripts/install-deps.sh installs it)
#        vm-run.sh -- COMMAND [ARG...]
#
# The guest is virtme-ng (PyPI, installed by install-deps.sh in $VM_CACHE/venv): qemu boots the
# kernel unpacked (not installed) in $VM_CACHE/kernel on a read-only 9p share of this machine's
# own root filesystem, with writable tmpfs overlays on /etc, /tmp, /var, ... that vanish with the
# guest. So the host's Ceph packages and the freshly built test binaries are simply there, and
# nothing the guest does reaches the host's files. No network device (`-net none`): the guest
# has only its own loopback. COMMAND runs as root in the guest; its stdout/stderr come back on
# ours and its exit status is ours.
#
# env: VM_CACHE=/opt/rbd-provisioner-vm  kernel + virtme-ng (outside /var/cache and /tmp: the
#                                        guest mounts its own tmpfs there)
#      VM_MEMORY=3G VM_CPUS=2
#      VM_ACCEL=tcg|kvm                  tcg (default): nested KVM hangs or aborts on the CI
#                                        machines; kvm where it works
set -euo pipefail
VM_CACHE=${VM_CACHE:-/opt/rbd-provisioner-vm}
VM_MEMORY=${VM_MEMORY:-3G}
VM_CPUS=${VM_CPUS:-2}
VM_ACCEL=${VM_ACCEL:-tcg}

missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=("qemu-system-x86_64 (qemu-system-x86)")
[ -x "$VM_CACHE/venv/bin/vng" ] || missing+=("$VM_CACHE/venv/bin/vng (virtme-ng)")
KIMG=$(ls "$VM_CACHE"/kernel/boot/vmlinuz-* 2>/dev/null | head -n 1 || true)
[ -n "$KIMG" ] || missing+=("$VM_CACHE/kernel/boot/vmlinuz-* (linux-image, unpacked)")
# virtme-ng builds its initramfs with a static busybox, and its init needs udevd for the
# virtio-serial ports that carry the command's output and exit status
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
  missing+=("busybox-static")
[ -x /lib/systemd/systemd-udevd ] || [ -x /usr/lib/systemd/systemd-udevd ] || missing+=("udev")
command -v depmod >/dev/null 2>&1 || missing+=("kmod")
if [ ${#missing[@]} -gt 0 ]; then
  echo "vm-run: missing ${missing[*]}; run scripts/install-deps.sh" >&2
  exit 77
fi
if [ "${1:-}" = --check ]; then
  echo "vm-run: ready ($(basename "$KIMG"), $("$VM_CACHE/venv/bin/vng" --version 2>/dev/null | head -n 1))"
  exit 0
fi
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "usage: vm-run.sh --check | -- COMMAND [ARG...]" >&2; exit 2; }

# The command as one shell word list, run from the caller's directory.
cmd="cd $(printf '%q' "$PWD") && exec"
for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done

accel=(--disable-kvm)
[ "$VM_ACCEL" = kvm ] && accel=()
export PATH="$VM_CACHE/venv/bin:$PATH"
# --force-9p: the virtiofsd of Debian 12's qemu does not take virtme-ng's arguments (and
# waiting for it to fail costs seconds); 9p is what remains.
exec vng --force-9p --run "$KIMG" "${accel[@]}" --memory "$VM_MEMORY" --cpus "$VM_CPUS" \
  --exec "$cmd" </dev/null
