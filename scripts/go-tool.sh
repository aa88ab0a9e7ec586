#!/usr/bin/env bash
# go-tool.sh - a pinned Go tool built from its Go module (through the Go module proxy) into a
# cache, once, and its path printed on stdout:
#   scripts/go-tool.sh helm        # helm.sh/helm/v4 v4.3.2 -> /var/cache/rbd-provisioner/bin/helm-v4.3.2
#   scripts/go-tool.sh kustomize   # sigs.k8s.io/kustomize/kustomize/v5 v5.8.2 -> .../kustomize-v5.8.2
# A binary already in the cache is reused (a later version pin builds anew); concurrent calls wait
# for one build (flock). Needs the machine's Go (1.26: the newest pins it builds). GO_TOOL_CACHE
# names another cache folder. Build output goes to stderr.
set -euo pipefail

case "${1:-}" in
  helm) module=helm.sh/helm/v4 package=helm.sh/helm/v4/cmd/helm version=v4.3.2 ;;
  kustomize) module=sigs.k8s.io/kustomize/kustomize/v5 package=$module version=v5.8.2 ;;
  *) echo "usage: $0 helm|kustomize" >&2; exit 2 ;;
esac
tool=$1
dir=${GO_TOOL_CACHE:-/var/cache/rbd-provisioner/bin}
bin=$dir/$tool-$version

if [ ! -x "$bin" ]; then
  command -v go >/dev/null 2>&1 || { echo "go-tool.sh: no go command: cannot build $tool $version" >&2; exit 1; }
  mkdir -p "$dir"
  exec 9>"$bin.lock"
  flock 9
  # another call may have built it while this one waited
  if [ ! -x "$bin" ]; then
    # what a killed build left (this lock is held: no build of this tool is under way)
    rm -rf "$dir/.build-$tool".*
    tmp=$(mktemp -d "$dir/.build-$tool.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    echo "go-tool.sh: building $tool from $module@$version" >&2
    start=$SECONDS
    # Modules and build cache of its own, removed with the build (about 1.8 GB for helm, no use
    # once the binary is here; -modcacherw lets rm remove the modules). GOTOOLCHAIN=local: a pin
    # whose go.mod wants a newer Go fails here instead of fetching one. CGO_ENABLED=0: a static
    # binary, as upstream releases them.
    # Three tries: a download the proxy drops midway fails the build, and a retry fetches only
    # what the module cache above does not hold yet.
    for attempt in 1 2 3; do
      GOBIN=$tmp/bin GOMODCACHE=$tmp/mod GOCACHE=$tmp/cache GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        CGO_ENABLED=0 nice go install -trimpath "$package@$version" >&2 &
      # a stop (test.sh's cleanup) ends the build too, and the EXIT trap removes its files
      build=$!
      trap 'kill "$build" 2>/dev/null; exit 1' INT TERM
      if wait "$build"; then
        break
      fi
      if [ "$attempt" = 3 ]; then
        echo "go-tool.sh: building $tool $version failed $attempt times (above)" >&2
        exit 1
      fi
      echo "go-tool.sh: building $tool $version failed (try $attempt of 3); again in 10 s" >&2
      sleep 10
    done
    mv "$tmp/bin/$tool" "$bin"
    echo "go-tool.sh: $tool $version built in $((SECONDS - start)) s: $bin" >&2
  fi
fi
echo "$bin"
