#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries the tests need (kube-apiserver,
# etcd, and on request kube-controller-manager, kube-scheduler, kubectl) from the
# Go module proxy, because no envtest asset download works from CI machines.
# Binaries land in $CACHE/k8s/<version>/; a binary already there is reused, so
# the script is idempotent and only the first (cold) run is slow (~9 min).
#
# usage: hack/build-k8s.sh [component ...]   (default: kube-apiserver etcd)
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
STAGING_VERSION="${STAGING_VERSION:-v0.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"
CACHE="${CACHE:-$HOME/.cache/chimera-test}"
OUT="$CACHE/k8s/$K8S_VERSION"
GO="${GO:-go}"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube-apiserver etcd)
mkdir -p "$OUT"

build_etcd() {
  [ -x "$OUT/etcd" ] && return 0
  local wrap="$CACHE/k8s/wrap-etcd-$ETCD_VERSION"
  mkdir -p "$wrap"
  (
    cd "$wrap"
    [ -f go.mod ] || { printf 'module chimera.local/etcdwrap\n\ngo 1.26\n' > go.mod; }
    printf 'package main\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
    GOFLAGS=-mod=mod "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$OUT/etcd.tmp" "$OUT/etcd"
}

# The kubernetes module replaces its k8s.io/* staging modules with ./staging
# paths; a wrapper module must replace each with the matching published tag.
prepare_k8s_wrapper() {
  local wrap="$CACHE/k8s/wrap-kubernetes-$K8S_VERSION"
  mkdir -p "$wrap"
  if [ ! -f "$wrap/.ready" ]; then
    local gomod
    gomod=$(cd "$wrap" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [ -f "$gomod" ] || { echo "build-k8s: could not download k8s.io/kubernetes@$K8S_VERSION go.mod" >&2; exit 1; }
    {
      printf 'module chimera.local/k8swrap\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
      grep -E '^[[:space:]]*k8s.io/[^ ]+ => \./staging/' "$gomod" \
        | awk -v v="$STAGING_VERSION" '{printf "replace %s => %s %s\n", $1, $1, v}'
    } > "$wrap/go.mod"
    printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > "$wrap/tools.go"
    (cd "$wrap" && GOFLAGS=-mod=mod "$GO" mod tidy >/dev/null 2>&1 || true)
    touch "$wrap/.ready"
  fi
  echo "$wrap"
}

build_k8s() {
  local name="$1"
  [ -x "$OUT/$name" ] && return 0
  local wrap
  wrap=$(prepare_k8s_wrapper)
  local vpkg=k8s.io/component-base/version
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  (
    cd "$wrap"
    CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w \
      -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor" \
      -o "$OUT/$name.tmp" "k8s.io/kubernetes/cmd/$name"
  )
  mv "$OUT/$name.tmp" "$OUT/$name"
}

for c in "${components[@]}"; do
  case "$c" in
    etcd) build_etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet) build_k8s "$c" ;;
    *) echo "build-k8s: unknown component '$c' (known: etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)" >&2; exit 2 ;;
  esac
  echo "build-k8s: $OUT/$c ready"
done
