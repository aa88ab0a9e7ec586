#!/usr/bin/env bash
# demo.sh - the whole system on one machine: a real Ceph cluster (micro-ceph), the emulated
# Kubernetes API, and the provisioner. Applies the example StorageClass (old-style parameters)
# and two PVCs (filesystem and block), shows them Bound and their images in Ceph, expands one,
# deletes one and shows its image gone, then cleans everything up (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Installing packages (idempotent)"
./scripts/install-deps.sh

step "Building rbd-provisioner and kube-emulator"
cargo build --quiet -p rbd-provisioner -p kube-emulator
BIN=$ROOT/target/debug

WORK=$(mktemp -d /tmp/rbd-demo.XXXXXX)
PIDS=()
cleanup() {
  rc=$?
  step "Cleaning up"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -d "$WORK/ceph/run" ] && "$ROOT/scripts/micro-ceph-stop.sh" "$WORK/ceph" >/dev/null
  rm -rf "$WORK"
  [ $rc = 0 ] && echo "demo finished" || echo "demo FAILED (exit $rc); logs were in $WORK"
  exit $rc
}
trap cleanup EXIT INT TERM

step "Starting a single-node Ceph cluster (1 mon + 1 OSD, memstore, cephx)"
MON_PORT=${MON_PORT:-46000} ./scripts/micro-ceph.sh "$WORK/ceph" | tail -1
# shellcheck disable=SC1091
. "$WORK/ceph/env"
export KUBECONFIG=$WORK/kubeconfig

step "Starting the emulated Kubernetes API (kube-emulator)"
"$BIN/kube-emulator" --listen 127.0.0.1:0 --kubeconfig-out "$KUBECONFIG" 2>"$WORK/emulator.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$KUBECONFIG" ] && break; sleep 0.1; done
kubectl version 2>/dev/null | head -2 || true
kubectl create namespace kube-system 2>/dev/null || true

step "Storing the Ceph admin key in a Secret, as the old provisioner's docs say"
# The docs' `--from-literal=key=...` would put the key in kubectl's argv (visible in ps), so the
# key goes through stdin instead: printf is a shell builtin, so no process has it in its argv.
printf '%s' "$CEPH_ADMIN_KEY" | kubectl create secret generic ceph-admin-secret \
  --type=kubernetes.io/rbd --from-file=key=/dev/stdin -n kube-system

step "Starting rbd-provisioner (leader election on, metrics on :${METRICS_PORT:=9190})"
"$BIN/rbd-provisioner" --kubeconfig "$KUBECONFIG" --metrics-port "$METRICS_PORT" \
  --metrics-address 127.0.0.1 2>"$WORK/provisioner.log" &
PIDS+=($!)

step "Applying the example StorageClass (old-style parameters) and two PVCs"
sed "s/MONITORS/$CEPH_MON_HOST/" deploy/examples/storageclass.yaml | kubectl apply -f -
kubectl apply -f deploy/examples/pvcs.yaml

step "Waiting for both claims to be Bound"
kubectl wait --for=jsonpath='{.status.phase}'=Bound pvc/data-fs pvc/data-block --timeout=60s
kubectl get pvc,pv
echo
echo "Images in Ceph (rbd ls -l $MICRO_CEPH_POOL):"
rbd ls -l "$MICRO_CEPH_POOL"
IMG=$(kubectl get pv "$(kubectl get pvc data-fs -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.rbd.image}{.spec.csi.volumeAttributes.imageName}')
echo
echo "Owner record of $IMG (rbd image-meta list):"
rbd image-meta list "$MICRO_CEPH_POOL/$IMG"

step "Expanding data-fs to 2Gi"
kubectl patch pvc data-fs --type merge -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}'
PV=$(kubectl get pvc data-fs -o jsonpath='{.spec.volumeName}')
kubectl wait --for=jsonpath='{.spec.capacity.storage}'=2Gi "pv/$PV" --timeout=60s
rbd info "$MICRO_CEPH_POOL/$IMG" | grep size

step "Deleting data-block: the provisioner removes its image, then the PV"
BPV=$(kubectl get pvc data-block -o jsonpath='{.spec.volumeName}')
BIMG=$(kubectl get pv "$BPV" -o jsonpath='{.spec.rbd.image}{.spec.csi.volumeAttributes.imageName}')
kubectl delete pvc data-block
kubectl wait --for=delete "pv/$BPV" --timeout=60s
if rbd ls "$MICRO_CEPH_POOL" | grep -qx "$BIMG"; then echo "image $BIMG still exists!"; exit 1; fi
echo "image $BIMG is gone"
rbd ls -l "$MICRO_CEPH_POOL"

step "Metrics (excerpt)"
curl -s "127.0.0.1:$METRICS_PORT/metrics" | grep -E '^controller_persistentvolume(claim)?_(provision|delete)_total' || true
