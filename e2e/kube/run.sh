#!/usr/bin/env bash
# A one-node Kubernetes cluster for the real end-to-end: the control plane
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) on this
# host's 127.0.0.1 and a kubelet node inside a QEMU guest (build-node.sh) with
# our images preloaded (images-disk.sh). Waits for the node to be Ready, runs
# COMMAND with KUBECONFIG pointing at the cluster, and tears everything down
# on exit, failure or not (QEMU, every control-plane process: by pid, ours only).
#
#   run.sh [-k] [COMMAND ARGS...]      (-k: keep the cluster up until Ctrl-C)
#
# Environment: IMAGES (space-separated OCI archives to preload), K8S_BIN
# ($CACHE/k8s/v1.34.4), RUN_DIR ($CACHE/kube/run: logs, console, certificates
# of the last run), GUEST_MEM_MB (2048), NODE_READY_TIMEOUT_S (180, per boot),
# NODE_BOOT_ATTEMPTS (2: a guest whose kernel stalls at boot is booted again),
# PV_DISK_MB (4096: the sparse disk hostPath PersistentVolumes live on).
#
# Addresses: the apiserver binds 127.0.0.1:6443 and advertises 10.0.2.2 (the
# host as the guest sees it through QEMU user networking); the node is named
# `localhost` and its kubelet port is forwarded to 127.0.0.1:10250, so the
# apiserver (kubectl logs/exec) reaches the kubelet only over loopback and
# never dials the guest's 10.0.2.15, which on the host would leave the machine.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
K8S_BIN=${K8S_BIN:-$CACHE/k8s/v1.34.4}
RUN_DIR=${RUN_DIR:-$CACHE/kube/run}
GUEST_MEM_MB=${GUEST_MEM_MB:-2048}
NODE_READY_TIMEOUT_S=${NODE_READY_TIMEOUT_S:-180}
APISERVER_PORT=6443
ETCD_PORT=22379          # + peer 22380; away from the fake-cluster e2e's 12379
KUBELET_PORT=10250
CP_START_TIMEOUT_S=60
SERVICE_CIDR=10.96.0.0/24

log() { echo "kube-e2e: $(date +%H:%M:%S) $*" >&2; }
die() { echo "kube-e2e: ERROR: $*" >&2; exit 1; }

keep=0
if [ "${1:-}" = "-k" ]; then keep=1; shift; fi

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b missing (hack/build-k8s.sh $b)"
done
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in $APISERVER_PORT $ETCD_PORT $((ETCD_PORT + 1)) $KUBELET_PORT; do
  port_free "$p" || die "127.0.0.1:$p is in use (another e2e run?)"
done

node=$("$here/build-node.sh" "$K8S_BIN/kubelet" | tail -n1)
[ -s "$node/root.img" ] || die "node build failed"
images_img=""
if [ -n "${IMAGES:-}" ]; then
  # shellcheck disable=SC2086
  images_img=$("$here/images-disk.sh" $IMAGES | tail -n1)
  [ -s "$images_img" ] || die "images disk build failed"
fi

rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR/pki" "$RUN_DIR/share/logs"
pki=$RUN_DIR/pki
share=$RUN_DIR/share      # the guest's /run/kube (9p): its config in, its logs out

pids=()
cleanup() {
  local rc=$?
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 30); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -f "$RUN_DIR/pv.img"
  log "torn down (logs: $RUN_DIR)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- certificates and credentials (fresh per run: nothing outlives it) ---
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=chimera-kube-e2e-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt"
issue() {  # name subject extensions
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$pki/$1.key" -out "$pki/$1.csr"
  printf '%s\n' "$3" >"$pki/$1.ext"
  ossl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt"
}
issue apiserver "/CN=kube-apiserver" "subjectAltName=IP:10.0.2.2,IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
issue kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
issue node "/O=system:nodes/CN=system:node:localhost" "extendedKeyUsage=clientAuth"
ossl genrsa -out "$pki/sa.key" 2048
ossl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
admin_token=$(openssl rand -hex 24)
printf '%s,admin,admin-uid,system:masters\n' "$admin_token" >"$pki/tokens.csv"
chmod 600 "$pki"/*.key "$pki/tokens.csv"

kubeconfig() {  # file server user-yaml
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: u
  user:
$3
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
EOF
  chmod 600 "$1"
}
kubeconfig "$RUN_DIR/kubeconfig" "https://127.0.0.1:$APISERVER_PORT" "    token: $admin_token"
kubeconfig "$share/kubelet.kubeconfig" "https://10.0.2.2:$APISERVER_PORT" \
"    client-certificate-data: $(base64 -w0 <"$pki/node.crt")
    client-key-data: $(base64 -w0 <"$pki/node.key")"
cp "$pki/ca.crt" "$share/ca.crt"
cat >"$share/kubelet.yaml" <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
port: 10250
readOnlyPort: 0
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
resolvConf: ""
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /run/kube/ca.crt}
authorization: {mode: Webhook}
# The preloaded images are all there is (no registry): never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 32Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
maxPods: 40
EOF
export KUBECONFIG=$RUN_DIR/kubeconfig
kubectl=$K8S_BIN/kubectl

launch() {  # name args...
  local name=$1; shift
  "$K8S_BIN/$name" "$@" >"$RUN_DIR/$name.log" 2>&1 </dev/null &
  pids+=($!)
}
wait_for() {  # what timeout_s command...
  local what=$1 t=$2; shift 2
  local deadline=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { log "$what not ready after ${t}s"; return 1; }
    sleep 0.3
  done
}

t0=$SECONDS
launch etcd --name=e2e --data-dir="$RUN_DIR/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster="e2e=http://127.0.0.1:$((ETCD_PORT + 1))" --listen-metrics-urls="" \
  --unsafe-no-fsync --quota-backend-bytes=$((512 << 20))
wait_for etcd $CP_START_TIMEOUT_S curl -fsS "http://127.0.0.1:$ETCD_PORT/health" || die "etcd did not start (log: $RUN_DIR/etcd.log)"
launch kube-apiserver --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port=$APISERVER_PORT --advertise-address=10.0.2.2 \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
  --kubelet-client-certificate="$pki/kubelet-client.crt" --kubelet-client-key="$pki/kubelet-client.key" \
  --kubelet-preferred-address-types=Hostname --kubelet-port=$KUBELET_PORT \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=$SERVICE_CIDR --authorization-mode=Node,RBAC \
  --allow-privileged=true --profiling=false
wait_for kube-apiserver $CP_START_TIMEOUT_S curl -fsS --cacert "$pki/ca.crt" -H "Authorization: Bearer $admin_token" \
  "https://127.0.0.1:$APISERVER_PORT/readyz" || die "kube-apiserver did not start (log: $RUN_DIR/kube-apiserver.log)"
# Both use the admin identity: a one-tenant test cluster, not a hardening exercise.
launch kube-controller-manager --kubeconfig="$RUN_DIR/kubeconfig" --leader-elect=false --secure-port=0 \
  --controllers='*,-serviceaccount-token' --root-ca-file="$pki/ca.crt" \
  --service-account-private-key-file="$pki/sa.key" --service-cluster-ip-range=$SERVICE_CIDR \
  --node-monitor-grace-period=180s
launch kube-scheduler --kubeconfig="$RUN_DIR/kubeconfig" --leader-elect=false --secure-port=0
log "control plane up in $((SECONDS - t0))s (https://127.0.0.1:$APISERVER_PORT)"

# --- the node ---
drives=(-drive "file=$node/root.img,if=virtio,format=raw,snapshot=on")
if [ -n "$images_img" ]; then drives+=(-drive "file=$images_img,if=virtio,format=raw,snapshot=on"); fi
# Room for PersistentVolumes (hostPath, under /var/lib/chimera-pv in the
# guest: the durable cluster's MDS and data-server volumes): a sparse ext4
# image of this run, found by its label, removed at teardown.
mkfs.ext4 -q -F -L chimera-pv "$RUN_DIR/pv.img" "${PV_DISK_MB:-4096}M" || die "cannot make the PV disk"
drives+=(-drive "file=$RUN_DIR/pv.img,if=virtio,format=raw")
# A TCG guest now and then stalls in its own kernel at boot on this shared
# host (soft lockups, RCU stalls: the emulated CPUs stop making progress, and
# the node never registers). That is the emulator, not the node: the node is
# booted again once, from the same snapshot disks, and the first attempt's
# console is kept. Any other failure to get Ready fails at once.
NODE_BOOT_ATTEMPTS=${NODE_BOOT_ATTEMPTS:-2}
boot_node() {
  qemu-system-x86_64 -accel tcg -cpu max -machine q35 -m "$GUEST_MEM_MB" -smp 2 \
    -nographic -no-reboot -serial "file:$RUN_DIR/console.log" -monitor none \
    -kernel "$node/vmlinuz" -initrd "$node/initrd.img" \
    -append "console=ttyS0 quiet panic=-1 no_timer_check" \
    "${drives[@]}" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$KUBELET_PORT-:$KUBELET_PORT" -device virtio-net-pci,netdev=n0,romfile= \
    -virtfs "local,path=$share,mount_tag=kube,security_model=none,id=kube" \
    </dev/null >"$RUN_DIR/qemu.log" 2>&1 &
  pids+=($!)
  qemu_pid=$!
  t_boot=$SECONDS
}
node_ready() {
  [ "$("$kubectl" get node localhost -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
guest_stalled() {
  grep -qE 'BUG: soft lockup|rcu_preempt detected stalls' "$RUN_DIR/console.log" 2>/dev/null
}
attempt=1
boot_node
until node_ready; do
  kill -0 "$qemu_pid" 2>/dev/null || { tail -n 30 "$RUN_DIR/console.log" >&2; die "QEMU exited before the node was Ready"; }
  if guest_stalled && [ "$attempt" -lt "$NODE_BOOT_ATTEMPTS" ]; then
    log "the guest kernel stalled $((SECONDS - t_boot))s after boot (soft lockup / RCU stall in console.log); booting the node again (attempt $((attempt + 1))/$NODE_BOOT_ATTEMPTS)"
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
    mv "$RUN_DIR/console.log" "$RUN_DIR/console-attempt$attempt.log"
    [ -d "$share/logs" ] && mv "$share/logs" "$share/logs-attempt$attempt"
    mkdir -p "$share/logs"
    attempt=$((attempt + 1))
    boot_node
    continue
  fi
  if [ $((SECONDS - t_boot)) -ge "$NODE_READY_TIMEOUT_S" ]; then
    tail -n 30 "$RUN_DIR/console.log" >&2
    tail -n 30 "$share/logs/kubelet.log" >&2 2>/dev/null || true
    die "node not Ready after ${NODE_READY_TIMEOUT_S}s (attempt $attempt; console: $RUN_DIR/console.log, kubelet: $share/logs/kubelet.log)"
  fi
  sleep 0.5
done
log "node localhost Ready $((SECONDS - t_boot))s after boot"
echo "NODE_READY_S=$((SECONDS - t_boot))" >"$RUN_DIR/timings"

if [ $keep = 1 ]; then
  log "cluster kept up: KUBECONFIG=$KUBECONFIG; Ctrl-C ends it"
  wait "$qemu_pid"
elif [ $# -gt 0 ]; then
  "$@"
fi
