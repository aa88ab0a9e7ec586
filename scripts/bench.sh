#!/usr/bin/env bash
# bench.sh - regenerates BENCHMARKS.md's generated section from a fresh machine in one command:
# installs the packages, runs the ceph-rbd operations benchmark (librbd in-process vs the `rbd`
# CLI), then the end-to-end provisioning benchmark with both control planes (unthrottled, and
# kube-controller-manager's default client limit) at N=100, 1000 and 5000, N=5000 three times,
# and writes its tables and the harness's verdicts between BENCHMARKS.md's rbd-bench markers.
# About 55 minutes on a 2-vCPU machine, builds included. Extra arguments go to rbd-bench (see --help), e.g.
#   scripts/bench.sh --out /tmp/provisioning.json
# Everything it starts (micro-ceph, the emulator, the provisioner) is stopped when it ends,
# also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
exec cargo run --release -p rbd-bench -- \
  --claims 100,1000,5000,5000,5000 --profile ours --ceph-bench --markdown BENCHMARKS.md "$@"
