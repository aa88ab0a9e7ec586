#!/usr/bin/env bash
# in-release-root.sh RELEASE COMMAND... - run COMMAND (typically cargo) in the workspace, chrooted
# into a Ceph release's development root, so that what it builds links that release's
# librados/librbd and what it runs talks to that release's daemons with their defaults:
#
#   scripts/in-release-root.sh tentacle-dev cargo build --release -p rbd-provisioner
#   scripts/in-release-root.sh tentacle-dev cargo test -p rbd-provisioner --test e2e
#
# The root is made (once) by `scripts/ceph-release.sh RELEASE` (tentacle-dev: Debian sid's Ceph
# 20.2 with its development files). The command runs in a private mount namespace where /tmp,
# /proc, /sys, /dev, this workspace, the `shared` folder beside it and CSI_SANITY's folder
# (csi-sanity) are bound at their own paths, and the host's Rust toolchain (RUSTUP_HOME,
# CARGO_HOME) read-only: nothing stays mounted on the host, and nothing is installed into it.
# Cargo runs offline (the host's registry cache serves the crates; build on the host once first)
# with its own target folder, target/ceph-RELEASE, so the host's build (Pacific's client) stays as
# it is. micro-ceph.sh, started by the tests, runs the root's own Ceph daemons (CEPH_ROOT is
# cleared).
set -euo pipefail
RELEASE=${1:?usage: in-release-root.sh RELEASE COMMAND...}
shift
[ $# -gt 0 ] || { echo "in-release-root.sh: no command given" >&2; exit 2; }
WS=$(realpath "$(dirname "$0")/..")
ROOT=$("$WS/scripts/ceph-release.sh" "$RELEASE")
[ -x "$ROOT/usr/bin/pkg-config" ] || { echo "in-release-root.sh: $ROOT has no development files (use a -dev release)" >&2; exit 1; }
CARGO_BIN=$(rustup which cargo 2>/dev/null || realpath "$(command -v cargo)")
TOOLCHAIN_BIN=$(dirname "$CARGO_BIN")
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup} CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
export CARGO_TARGET_DIR=$WS/target/ceph-$RELEASE CARGO_NET_OFFLINE=true
export PATH=$TOOLCHAIN_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset CEPH_ROOT CEPH_ARGS CEPH_CONF CEPH_KEYRING LD_LIBRARY_PATH
SHARED=$(realpath -m "$WS/../shared")
# a csi-sanity named by CSI_SANITY is bound too (its folder, read-only)
SANITY_DIR=""
if [ -n "${CSI_SANITY:-}" ]; then CSI_SANITY=$(realpath "$CSI_SANITY"); SANITY_DIR=$(dirname "$CSI_SANITY"); fi
export SANITY_DIR
export WS SHARED ROOT
# shellcheck disable=SC2016 # expanded by the inner shell
exec unshare --mount --propagation private bash -c '
  set -e
  bind() { mkdir -p "$ROOT$1"; mount --bind "$1" "$ROOT$1"; }
  bind_ro() { bind "$1"; mount -o remount,bind,ro "$ROOT$1"; }
  for d in /tmp /proc "$WS"; do bind "$d"; done
  # recursive: /sys/fs/cgroup and its hierarchies (the node plugin'"'"'s daemon cgroups), /dev/shm
  for d in /sys /dev; do mkdir -p "$ROOT$d"; mount --rbind "$d" "$ROOT$d"; done
  for d in "$RUSTUP_HOME" "$CARGO_HOME"; do [ -d "$d" ] && bind_ro "$d"; done
  [ -d "$SHARED" ] && bind_ro "$SHARED"
  [ -n "$SANITY_DIR" ] && bind_ro "$SANITY_DIR"
  exec chroot "$ROOT" sh -c "cd \"\$WS\" && exec \"\$@\"" in-release-root "$@"
' in-release-root "$@"
