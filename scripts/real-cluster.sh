#!/usr/bin/env bash
# real-cluster.sh - a real one-node Kubernetes on this machine, built from its Go modules:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the upstream snapshot-controller
# and a kubelet on containerd, with their kubectl. The project's tests run its manifests, images and Helm chart on it
# (crates/rbd-provisioner/tests/real_cluster.rs); you can use it the same way.
#
#   scripts/real-cluster.sh build   # build the binaries into the cache (once); prints the folder
#   scripts/real-cluster.sh start   # build if needed, start everything, wait for the node: Ready
#   scripts/real-cluster.sh stop    # delete the node's pods (their volumes torn down by the
#                                   # kubelet), stop everything, undo what start changed
#
#   scripts/real-cluster.sh load IMAGE...   # podman images into the node's containerd, under
#                                   # the name a manifest's unqualified one means
#                                   # (localhost/rbd-provisioner:latest -> docker.io/library/
#                                   # rbd-provisioner:latest)
#   scripts/real-cluster.sh kubectl ARGS...  # the cluster's own kubectl (v1.36.3) on it
#   export KUBECONFIG=$(scripts/real-cluster.sh kubeconfig)
#
# Versions: Kubernetes v1.36.3 (k8s.io/kubernetes, its staging modules at v0.36.3), etcd v3.6.8
# (go.etcd.io/etcd/server/v3, the release Kubernetes 1.36 is tested with), snapshot-controller
# v8.7.0 (github.com/kubernetes-csi/external-snapshotter/v8) and its CRDs; pinned by
# scripts/real-cluster/go.mod, go.sum and snapshot-controller/go.{mod,sum}. Fetched through the Go
# module proxy, built with this machine's Go (1.26) into REAL_CLUSTER_CACHE (default
# /var/cache/rbd-provisioner/real-cluster): about 25 minutes on 2 cores the first time, nothing
# later. The pod sandbox (pause) and busybox images are made here from pause.c and Debian's
# busybox-static (no registry is reached); containerd, runc and the CNI plugins are Debian's.
#
# What this cluster is: one node, no kube-proxy (pods that talk to the API server or to Ceph use
# the host network; other pods get an address on a bridge that reaches nothing else), token
# authentication as system:masters in the kubeconfig, RBAC on, the kubelet's own API open to
# anonymous requests on the node IP. A test cluster: each start begins with empty etcd data.
# Needs root, and the ports 6443, 10248, 10250, 10257, 10259, 23790-23810 free; one per machine.
#
# Env: REAL_CLUSTER_DIR (state, logs, kubeconfig; default /var/lib/rbd-provisioner-real-cluster),
# REAL_CLUSTER_CACHE, REAL_CLUSTER_NODE (node-1), REAL_CLUSTER_NODE_IP (default: the machine's
# first global IPv4 address, else 192.0.2.2 added on lo), REAL_CLUSTER_READY_TIMEOUT (180 s).
#
# What start changes on the host, and stop undoes: the node IP (when added), the sysctls the
# kubelet sets at its start (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops: put back
# as soon as the node is Ready), /var/lib/kubelet (the kubelet bind-mounts it onto itself),
# /run/rbd-csi made a shared mount point (deploy/csi/node.yaml mounts it Bidirectional, which
# the kubelet refuses on a host where /run is not a shared mount), the CNI bridge rcbr0.
set -euo pipefail
set +m

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$HERE/real-cluster
KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.8
SNAPSHOTTER_VERSION=v8.7.0
CACHE=${REAL_CLUSTER_CACHE:-/var/cache/rbd-provisioner/real-cluster}
BIN=$CACHE/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-snapshotter-$SNAPSHOTTER_VERSION
DIR=${REAL_CLUSTER_DIR:-/var/lib/rbd-provisioner-real-cluster}
RUN=$DIR/run
PKI=$DIR/pki
KCFG=$DIR/kubeconfig
NODE=${REAL_CLUSTER_NODE:-node-1}
ROOT=/var/lib/kubelet   # the manifests' hostPaths name it
READY_TIMEOUT=${REAL_CLUSTER_READY_TIMEOUT:-180}
SOCK=/run/containerd/containerd.sock
BRIDGE=rcbr0
IPAM_DIR=/run/rbd-real-cluster-cni
ETCD_URL=http://127.0.0.1:23790
# what the kubelet sets at its start (its kernel tunables); saved before, put back after
SYSCTLS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
BINARIES="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl snapshot-controller"

log() { echo "real-cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }
k() { "$BIN/kubectl" --kubeconfig "$KCFG" --request-timeout=20s "$@"; }
cmdline() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true; }
# alive NAME: the PID recorded for NAME runs and is still NAME's binary
alive() {
  local f=$RUN/$1.pid
  [[ -s $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && [[ $(cmdline "$(cat "$f")") == *"$1"* ]]
}
launch() { # launch NAME ARGS...: NAME from the cache (containerd: Debian's), its log in RUN
  local name=$1 exe=$BIN/$1
  shift
  [[ $name == containerd ]] && exe=containerd
  setsid "$exe" "$@" >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}
wait_for() { # wait_for NAME SECONDS COMMAND...: until COMMAND succeeds, while NAME runs
  local name=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 2; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    alive "$name" || die "$name exited; its log, $RUN/$name.log, ends: $(tail -5 "$RUN/$name.log")"
    sleep 0.5
  done
  die "$name not up after $secs s; see $RUN/$name.log"
}

# ---------------------------------------------------------------------------------------- build
build() {
  local b missing=0
  for b in $BINARIES pause.tar busybox.tar crds; do [[ -e $BIN/$b ]] || missing=1; done
  if [[ $missing == 0 ]]; then echo "$BIN"; return 0; fi
  command -v go >/dev/null || die "no go command: cannot build Kubernetes $KUBE_VERSION"
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.build.lock"
  flock 8
  missing=0
  for b in $BINARIES pause.tar busybox.tar crds; do [[ -e $BIN/$b ]] || missing=1; done
  if [[ $missing == 0 ]]; then echo "$BIN"; return 0; fi
  rm -rf "$CACHE"/.build.*   # what a killed build left (the lock is ours)
  local tmp start=$SECONDS attempt ld p
  tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/out"
  log "building Kubernetes $KUBE_VERSION, etcd $ETCD_VERSION, snapshot-controller $SNAPSHOTTER_VERSION from their Go modules"
  # Modules and build cache of their own, removed with the build (about 4 GB, no use once the
  # binaries are here). -mod=readonly: go.mod and go.sum as committed. CGO_ENABLED=0: static
  # binaries, as upstream releases them. The version stamp is what `make` would write.
  export GOMODCACHE=$tmp/mod GOCACHE=$tmp/cache GOFLAGS="-modcacherw -mod=readonly" GOTOOLCHAIN=local CGO_ENABLED=0
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean"
  done
  # three tries: a download the proxy drops midway fails a build; a retry fetches what is missing
  for attempt in 1 2 3; do
    if go_build "$SRC" -ldflags "$ld" -o "$tmp/out/" \
         k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
         k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
         go.etcd.io/etcd/server/v3 &&
       go_build "$SRC/snapshot-controller" -ldflags "-s -w -X main.version=$SNAPSHOTTER_VERSION" \
         -o "$tmp/out/" github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller; then
      break
    fi
    [[ $attempt == 3 ]] && die "the Go build failed 3 times (above)"
    log "the Go build failed (try $attempt of 3); again in 10 s"
    sleep 10
  done
  mv "$tmp/out/server" "$tmp/out/etcd"   # go.etcd.io/etcd/server/v3's command
  # the snapshot CRDs of the same release (group snapshots' too: the controller lists them), from
  # its client module
  mkdir -p "$tmp/out/crds"
  cp "$GOMODCACHE/github.com/kubernetes-csi/external-snapshotter/client/v8@$(cd "$SRC/snapshot-controller" &&
      go list -m -f '{{.Version}}' github.com/kubernetes-csi/external-snapshotter/client/v8)"/config/crd/*snapshot.storage.k8s.io_*.yaml \
    "$tmp/out/crds/"
  images "$tmp/out"
  rm -rf "$BIN"
  mv "$tmp/out" "$BIN"
  log "built in $((SECONDS - start)) s: $BIN"
  echo "$BIN"
}

# go_build MODULE-DIR ARGS...: `go build -trimpath ARGS` in that module, at low priority; a stop
# (INT, TERM: test.sh's cleanup) ends the build too
go_build() {
  local dir=$1 pid
  shift
  nice go -C "$dir" build -trimpath "$@" >&2 &
  pid=$!
  # shellcheck disable=SC2064
  trap "kill $pid 2>/dev/null; exit 1" INT TERM
  wait "$pid"
}

# images OUT: the pod sandbox image (containerd's sandbox_image) and a busybox image, both FROM
# scratch, saved as docker archives for `ctr images import`
images() {
  local out=$1 ctx applet
  command -v podman >/dev/null || die "podman missing (scripts/install-deps.sh installs it)"
  [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 || die "no static /bin/busybox (busybox-static)"
  ctx=$(mktemp -d)
  mkdir -p "$ctx/pause" "$ctx/busybox/bin" "$ctx/busybox/etc" "$ctx/busybox/tmp" "$ctx/busybox/data"
  cc -static -O2 -s -o "$ctx/pause/pause" "$SRC/pause.c"
  printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$ctx/pause/Containerfile"
  cp /bin/busybox "$ctx/busybox/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ $applet == busybox ]] || ln -s busybox "$ctx/busybox/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$ctx/busybox/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/busybox/etc/group"
  chmod 1777 "$ctx/busybox/tmp"
  printf 'FROM scratch\nCOPY . /\nENV PATH=/bin\nCMD ["/bin/sh"]\n' >"$ctx/busybox/Containerfile"
  podman build -q -t registry.k8s.io/pause:3.10 "$ctx/pause" >/dev/null
  podman build -q -t docker.io/local/busybox:1 "$ctx/busybox" >/dev/null
  podman save -q --format docker-archive -o "$out/pause.tar" registry.k8s.io/pause:3.10
  podman save -q --format docker-archive -o "$out/busybox.tar" docker.io/local/busybox:1
  podman rmi -f registry.k8s.io/pause:3.10 docker.io/local/busybox:1 >/dev/null
  rm -rf "$ctx"
}

# ---------------------------------------------------------------------------------------- start
pki() {
  mkdir -p "$PKI"
  (
    cd "$PKI"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 -subj /CN=real-cluster-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
      "$NODE_IP" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$(openssl rand -hex 24),admin,admin,system:masters" >tokens.csv
  )
  umask 077
  cat >"$KCFG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: real-cluster
  cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")}
users:
- name: admin
  user: {token: $(cut -d, -f1 "$PKI/tokens.csv")}
contexts:
- name: real-cluster
  context: {cluster: real-cluster, user: admin}
current-context: real-cluster
EOF
  umask 022
}

node_ready() { # node_ready SINCE: Ready, by a heartbeat at or after SINCE (an earlier kubelet's
  # Node stays Ready for ~40 s after it has gone)
  local st hb
  read -r st hb < <(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || true
  [[ $st == True && ! $hb < $1 ]]
}

restore_sysctls() {
  local key val
  [[ -s $RUN/sysctls ]] || return 0
  while read -r key val; do
    [[ $(cat "/proc/sys/$key") == "$val" ]] || echo "$val" >"/proc/sys/$key" || log "could not put back $key=$val"
  done <"$RUN/sysctls"
}

start() {
  [[ $(id -u) == 0 ]] || die "run as root"
  local n b
  for n in $BINARIES containerd; do
    alive "$n" && die "$n of an earlier start runs (pid $(cat "$RUN/$n.pid")): $0 stop first"
  done
  pgrep -x kubelet >/dev/null && die "a kubelet not started here runs (pid $(pgrep -x kubelet | tr '\n' ' '))"
  [[ -S $SOCK ]] && ctr --connect-timeout 2s version >/dev/null 2>&1 &&
    die "a containerd not started here answers on $SOCK; stop it first (this script configures its own)"
  for b in openssl containerd ctr runc ip cc podman; do
    command -v "$b" >/dev/null || die "missing command $b (scripts/install-deps.sh)"
  done
  local cni
  for cni in /usr/lib/cni /opt/cni/bin; do [[ -x $cni/bridge ]] && break; done
  [[ -x $cni/bridge && -x $cni/host-local && -x $cni/loopback ]] || die "no CNI plugins (containernetworking-plugins)"
  build >/dev/null

  rm -rf "$RUN" "$PKI" "$DIR/etcd"
  mkdir -p "$RUN"
  NODE_IP=${REAL_CLUSTER_NODE_IP:-$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')}
  if [[ -z $NODE_IP ]]; then
    NODE_IP=192.0.2.2
  fi
  if ! ip -o addr show | awk '{split($4, a, "/"); print a[1]}' | grep -qxF "$NODE_IP"; then
    ip addr add "$NODE_IP/32" dev lo
    echo "$NODE_IP/32" >"$RUN/node-ip-added"
  fi
  printf 'node_ip=%s\n' "$NODE_IP" >"$RUN/state"
  pki

  launch etcd --name real-cluster --data-dir "$DIR/etcd" \
    --listen-client-urls $ETCD_URL --advertise-client-urls $ETCD_URL \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster real-cluster=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810 \
    --log-level warn
  wait_for etcd 30 curl -fsS $ETCD_URL/health

  launch kube-apiserver --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port=6443 \
    --etcd-servers=$ETCD_URL --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true --profiling=false \
    --kubelet-preferred-address-types=InternalIP,Hostname
  wait_for kube-apiserver 120 bash -c "[[ \$('$BIN/kubectl' --kubeconfig '$KCFG' get --raw /readyz) == ok ]]"

  launch kube-controller-manager --kubeconfig="$KCFG" \
    --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
    --use-service-account-credentials=false --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range=10.96.0.0/16 --profiling=false
  wait_for kube-controller-manager 60 curl -fsSk https://127.0.0.1:10257/healthz

  launch kube-scheduler --kubeconfig="$KCFG" \
    --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false
  wait_for kube-scheduler 60 curl -fsSk https://127.0.0.1:10259/healthz

  k apply --server-side -f "$BIN/crds" >/dev/null
  k wait --for condition=established --timeout=60s -f "$BIN/crds" >/dev/null
  launch snapshot-controller --kubeconfig="$KCFG" --leader-election=false
  wait_for snapshot-controller 10 true

  # containerd, configured here (no registry reachable: images are imported, never pulled)
  mkdir -p "$RUN/cni"
  cat >"$RUN/cni/10-real-cluster.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "real-cluster", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [], "dataDir": "$IPAM_DIR"}},
  {"type": "loopback"}]}
EOF
  cat >"$RUN/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # a root without CAP_SYS_RESOURCE (containers, some CI machines) cannot lower a process's
  # oom_score_adj below its own: without this clamp runc fails every sandbox with "can't get
  # final child's PID from pipe: EOF"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false   # the kubelet's cgroupDriver: cgroupfs
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni"
    conf_dir = "$RUN/cni"
EOF
  launch containerd --config "$RUN/containerd.toml"
  wait_for containerd 30 bash -c "ctr plugins ls | awk '\$2 == \"cri\" {print \$NF}' | grep -qx ok"
  local im present
  present=$(ctr -n k8s.io images ls -q)
  for im in pause=registry.k8s.io/pause:3.10 busybox=docker.io/local/busybox:1; do
    grep -qxF "${im#*=}" <<<"$present" || ctr -n k8s.io images import "$BIN/${im%%=*}.tar" >/dev/null
  done

  # the host prerequisites of deploy/csi/node.yaml: /run/rbd-csi is mounted Bidirectional, which
  # needs a shared mount on the host
  mkdir -p /run/rbd-csi
  if [[ $(findmnt -no PROPAGATION --target /run/rbd-csi) != shared ]]; then
    if ! mountpoint -q /run/rbd-csi; then
      mount --bind /run/rbd-csi /run/rbd-csi
      echo 1 >"$RUN/rbd-csi-bind"
    fi
    mount --make-shared /run/rbd-csi
  fi

  local s
  for s in $SYSCTLS; do [[ -r /proc/sys/$s ]] && echo "$s $(cat "/proc/sys/$s")"; done >"$RUN/sysctls"
  mkdir -p "$ROOT"
  mountpoint -q "$ROOT" || echo 1 >"$RUN/root-bind"
  cat >"$RUN/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false          # cgroup v1 hosts: the kubelet refuses them by default since 1.35
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# test cluster: the API server has no kubelet client certificate; logs and exec reach the
# kubelet anonymously
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
protectKernelDefaults: false
makeIPTablesUtilChains: false  # leave the host's iptables alone
# images are imported, never pulled: never collect them, nor evict on a fairly full disk
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 10s
EOF
  local since
  since=$(date -u +%FT%TZ)
  launch kubelet --config="$RUN/kubelet.yaml" --kubeconfig="$KCFG" --hostname-override="$NODE" \
    --node-ip="$NODE_IP" --root-dir="$ROOT" --v=2
  wait_for kubelet "$READY_TIMEOUT" node_ready "$since"
  restore_sysctls
  log "node $NODE Ready ($NODE_IP); KUBECONFIG=$KCFG"
  echo "KUBECONFIG=$KCFG"
}

# ---------------------------------------------------------------------------------------- stop
stop_one() { # stop_one NAME: TERM (KILL after 30 s) the recorded process, if it is still NAME
  local f=$RUN/$1.pid pid i
  [[ -s $f ]] || return 0
  pid=$(cat "$f")
  if alive "$1"; then
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null && log "$1 (pid $pid) still ran after 30 s: killed"
  fi
  rm -f "$f"
}
unmount_under() { # unmount_under DIR: every mount below DIR, deepest first
  local m round
  for round in 1 2 3; do
    mapfile -t ms < <(awk -v d="${1%/}/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | LC_ALL=C sort -ru)
    [[ ${#ms[@]} == 0 ]] && return 0
    for m in "${ms[@]}"; do
      m=$(printf '%b' "$m")
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
}

# drain PODS: delete these pods (namespace/name lines) and wait up to 90 s for them to go
drain() {
  local pod i left
  [[ -n $1 ]] || return 0
  while read -r pod; do
    k -n "${pod%%/*}" delete pod "${pod#*/}" --grace-period=5 --wait=false >/dev/null 2>&1 || true
  done <<<"$1"
  for ((i = 0; i < 90; i++)); do
    left=$(while read -r pod; do k -n "${pod%%/*}" get pod "${pod#*/}" -o name 2>/dev/null || true; done <<<"$1")
    [[ -z $left ]] && return 0
    sleep 1
  done
  log "pods still there after 90 s: $(tr '\n' ' ' <<<"$left")"
}

stop() {
  [[ -d $RUN ]] || { log "nothing recorded in $RUN"; return 0; }
  [[ $(id -u) == 0 ]] || die "run as root"
  # everything that can be undone is, whatever fails on the way
  set +e
  local i left
  # the node's pods first, while the kubelet runs: it tears their volumes down (NodeUnpublish,
  # NodeUnstage) while the plugins, DaemonSet pods, still serve; then the DaemonSets (deleting
  # their pods alone would have them made again)
  if alive kubelet && [[ $(k get --raw /readyz 2>/dev/null) == ok ]]; then
    drain "$(k get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name} {.metadata.ownerReferences[0].kind}{"\n"}{end}' 2>/dev/null |
      awk '$3 != "DaemonSet" {print $1 "/" $2}')"
    k delete daemonsets -A --all --wait=false >/dev/null 2>&1 || true
    drain "$(k get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' 2>/dev/null)"
  fi
  stop_one kubelet
  if alive containerd; then
    local c
    for c in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
    sleep 1
    for c in $(ctr -n k8s.io containers ls -q 2>/dev/null); do
      ctr -n k8s.io tasks delete --force "$c" >/dev/null 2>&1 || true
      ctr -n k8s.io containers rm "$c" >/dev/null 2>&1 || true
    done
  fi
  stop_one containerd
  unmount_under /run/containerd/io.containerd.grpc.v1.cri/sandboxes
  unmount_under /run/containerd/io.containerd.runtime.v2.task/k8s.io
  local ns
  for ns in /run/netns/cni-*; do [[ -e $ns ]] && { umount "$ns" 2>/dev/null; rm -f "$ns"; }; done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  rm -rf "$IPAM_DIR"
  unmount_under "$ROOT"
  if [[ -e $RUN/root-bind ]] && mountpoint -q "$ROOT"; then umount "$ROOT" || true; fi
  if [[ -e $RUN/rbd-csi-bind ]] && mountpoint -q /run/rbd-csi &&
     [[ -z $(awk 'index($5, "/run/rbd-csi/") == 1' /proc/self/mountinfo) ]]; then
    umount /run/rbd-csi || true
  fi
  for ((i = 0; i < 3; i++)); do
    find /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # what the project's node plugin leaves on a node it ran on: its daemons' cgroups (empty now:
  # rmdir refuses others) and the empty folders of its runtime dir
  find /sys/fs/cgroup -maxdepth 2 -type d -name rbd-csi-daemons -exec rmdir {} + 2>/dev/null
  find /run/rbd-csi -mindepth 1 -depth -type d -empty -delete 2>/dev/null
  for n in snapshot-controller kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_one "$n"; done
  restore_sysctls
  if [[ -s $RUN/node-ip-added ]]; then ip addr del "$(cat "$RUN/node-ip-added")" dev lo 2>/dev/null || true; fi
  rm -rf "$RUN" "$PKI" "$DIR/etcd" "$KCFG"
  log "stopped"
}

# load IMAGE...: each podman image imported into containerd's k8s.io namespace, also tagged as
# docker.io/library/NAME:TAG (what `image: NAME:TAG` resolves to)
load() {
  alive containerd || die "the cluster is not running (start first)"
  local image name tar
  tar=$RUN/image.tar
  for image in "$@"; do
    name=${image##*/}
    rm -f "$tar"
    podman save -q --format docker-archive -o "$tar" "$image"
    ctr -n k8s.io images import "$tar" >/dev/null
    ctr -n k8s.io images tag --force "$(ctr -n k8s.io images ls -q | grep -xF "$image" || echo "docker.io/$image")" \
      "docker.io/library/$name" >/dev/null
    log "loaded $image as docker.io/library/$name"
  done
  rm -f "$tar"
}

case "${1:-}" in
  build) build ;;
  load) shift; load "$@" ;;
  start) start ;;
  stop) stop ;;
  kubeconfig) echo "$KCFG" ;;
  kubectl)
    shift
    [[ -x $BIN/kubectl ]] || die "kubectl not built ($0 build)"
    exec "$BIN/kubectl" --kubeconfig "$KCFG" "$@" ;;
  *) echo "usage: $0 build|start|stop|load IMAGE...|kubeconfig|kubectl ARGS..." >&2; exit 2 ;;
esac
