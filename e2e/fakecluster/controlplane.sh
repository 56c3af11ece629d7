#!/usr/bin/env bash
# A real Kubernetes control plane on this host, without containers: etcd,
# kube-apiserver, kube-controller-manager (garbage collector, StatefulSet,
# PV binder ...) and kube-scheduler, all on 127.0.0.1, with their own CA,
# serving certificate, service-account keys and a static admin token.
# Used by the fake-cluster e2e (kwok nodes) and reusable by anything that
# wants a cluster here (see README.md in this folder).
#
# usage:
#   controlplane.sh start DIR   start everything, wait for /readyz, write DIR/kubeconfig
#   controlplane.sh stop DIR    kill every process with a DIR/*.pid file (ours only)
#
# Environment (defaults in brackets):
#   K8S_BIN            dir with etcd kube-apiserver kube-controller-manager kube-scheduler
#                      [$HOME/.cache/chimera-test/k8s/v1.34.4]
#   APISERVER_PORT     [16443]   ETCD_PORT [12379]   ETCD_PEER_PORT [ETCD_PORT+1]
#   ADVERTISE_ADDRESS  [127.0.0.1] the apiserver's advertised address (a SAN too)
#   EXTRA_SANS         comma-separated extra IPs / DNS names for the serving cert
#   EXTRA_TOKENS_FILE  more static-token lines (token,user,uid,"group1,group2")
#   AUTHORIZATION_MODE [RBAC] (Node,RBAC when a real kubelet joins)
#   CP_COMPONENTS      [etcd kube-apiserver kube-controller-manager kube-scheduler]
#   START_TIMEOUT_S    [60]
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

K8S_BIN="${K8S_BIN:-$HOME/.cache/chimera-test/k8s/v1.34.4}"
APISERVER_PORT="${APISERVER_PORT:-16443}"
ETCD_PORT="${ETCD_PORT:-12379}"
ETCD_PEER_PORT="${ETCD_PEER_PORT:-$((ETCD_PORT + 1))}"
ADVERTISE_ADDRESS="${ADVERTISE_ADDRESS:-127.0.0.1}"
EXTRA_SANS="${EXTRA_SANS:-}"
EXTRA_TOKENS_FILE="${EXTRA_TOKENS_FILE:-}"
AUTHORIZATION_MODE="${AUTHORIZATION_MODE:-RBAC}"
CP_COMPONENTS="${CP_COMPONENTS:-etcd kube-apiserver kube-controller-manager kube-scheduler}"
START_TIMEOUT_S="${START_TIMEOUT_S:-60}"
# Pods get addresses from this range on fake nodes; Services from this one.
SERVICE_CIDR="10.96.0.0/24"

stop_all() {
  local f pid
  shopt -s nullglob
  for f in "$dir"/*.pid; do
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  # Give them a moment to exit cleanly, then make sure.
  for _ in $(seq 1 50); do
    local alive=0
    for f in "$dir"/*.pid; do
      pid=$(cat "$f" 2>/dev/null || true)
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for f in "$dir"/*.pid; do
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

certs() {
  [ -s "$dir/pki/admin.token" ] && return 0
  local pki="$dir/pki"
  mkdir -p "$pki"
  local sans="IP:127.0.0.1,IP:$ADVERTISE_ADDRESS,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  local s
  IFS=, read -ra extra <<< "$EXTRA_SANS"
  for s in "${extra[@]}"; do
    [ -z "$s" ] && continue
    if [[ "$s" =~ ^[0-9.]+$ || "$s" == *:* ]]; then sans="$sans,IP:$s"; else sans="$sans,DNS:$s"; fi
  done
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=chimera-e2e-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" > "$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  # Static tokens: the admin (system:masters) and one per control-plane client.
  local admin kcm sched
  admin=$(openssl rand -hex 24); kcm=$(openssl rand -hex 24); sched=$(openssl rand -hex 24)
  {
    printf '%s,admin,admin-uid,system:masters\n' "$admin"
    printf '%s,system:kube-controller-manager,kcm-uid,system:masters\n' "$kcm"
    printf '%s,system:kube-scheduler,scheduler-uid\n' "$sched"
  } > "$pki/base-tokens.csv"
  chmod 600 "$pki"/*.key "$pki/base-tokens.csv"
  kubeconfig "$dir/kubeconfig" admin "$admin"
  kubeconfig "$dir/kube-controller-manager.kubeconfig" system:kube-controller-manager "$kcm"
  kubeconfig "$dir/kube-scheduler.kubeconfig" system:kube-scheduler "$sched"
  printf '%s\n' "$admin" > "$pki/admin.token"
}

kubeconfig() { # file user token
  local ca
  ca=$(base64 -w0 < "$dir/pki/ca.crt")
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: $2
  user:
    token: $3
contexts:
- name: e2e
  context: {cluster: e2e, user: $2}
current-context: e2e
EOF
  chmod 600 "$1"
}

launch() { # name args...
  local name="$1"; shift
  setsid "$K8S_BIN/$name" "$@" > "$dir/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/$name.pid"
}

wait_for() { # what command...
  local what="$1"; shift
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "controlplane: $what not ready after ${START_TIMEOUT_S}s; log tails:" >&2
      tail -n 20 "$dir"/*.log >&2 || true
      return 1
    fi
    sleep 0.3
  done
}

start() {
  mkdir -p "$dir"
  stop_all # a previous run's leftovers in this dir
  for c in $CP_COMPONENTS; do
    [ -x "$K8S_BIN/$c" ] || { echo "controlplane: $K8S_BIN/$c missing (hack/build-k8s.sh $c)" >&2; exit 1; }
  done
  for p in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    port_free "$p" || { echo "controlplane: 127.0.0.1:$p is in use (set APISERVER_PORT / ETCD_PORT)" >&2; exit 1; }
  done
  certs
  local pki="$dir/pki"
  # Our identities plus the caller's (e.g. a kubelet in system:nodes).
  cat "$pki/base-tokens.csv" > "$pki/tokens.csv"
  if [ -n "$EXTRA_TOKENS_FILE" ]; then
    [ -r "$EXTRA_TOKENS_FILE" ] || { echo "controlplane: EXTRA_TOKENS_FILE $EXTRA_TOKENS_FILE unreadable" >&2; exit 1; }
    cat "$EXTRA_TOKENS_FILE" >> "$pki/tokens.csv"
  fi
  chmod 600 "$pki/tokens.csv"
  local token
  token=$(cat "$pki/admin.token")
  for c in $CP_COMPONENTS; do
    case "$c" in
      etcd)
        launch etcd --name=e2e --data-dir="$dir/etcd" \
          --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
          --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
          --initial-cluster="e2e=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls="" \
          --unsafe-no-fsync --quota-backend-bytes=$((512 << 20))
        wait_for "etcd" curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
        ;;
      kube-apiserver)
        launch kube-apiserver --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
          --bind-address=127.0.0.1 --secure-port="$APISERVER_PORT" --advertise-address="$ADVERTISE_ADDRESS" \
          --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
          --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
          --service-account-issuer=https://kubernetes.default.svc.cluster.local \
          --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
          --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode="$AUTHORIZATION_MODE" \
          --allow-privileged=true --kubelet-preferred-address-types=Hostname,InternalIP \
          --profiling=false
        wait_for "kube-apiserver" curl -fsS --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" \
          "https://127.0.0.1:$APISERVER_PORT/readyz"
        ;;
      kube-controller-manager)
        # serviceaccount-token: tokens are projected, no legacy token Secrets.
        launch kube-controller-manager --kubeconfig="$dir/kube-controller-manager.kubeconfig" \
          --controllers='*,-serviceaccount-token' --leader-elect=false --secure-port=0 \
          --root-ca-file="$pki/ca.crt" --service-cluster-ip-range="$SERVICE_CIDR" \
          --node-monitor-grace-period=1h --concurrent-statefulset-syncs=2
        ;;
      kube-scheduler)
        launch kube-scheduler --kubeconfig="$dir/kube-scheduler.kubeconfig" --leader-elect=false --secure-port=0
        ;;
      *) echo "controlplane: unknown component $c" >&2; exit 2 ;;
    esac
  done
  echo "controlplane: up at https://127.0.0.1:$APISERVER_PORT (kubeconfig $dir/kubeconfig)"
}

case "$cmd" in
  start) start ;;
  stop) [ -d "$dir" ] && stop_all; echo "controlplane: stopped ($dir)" ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
