#!/usr/bin/env bash
# Installs the Go tools the operator build and tests use into $CACHE/bin at
# pinned versions. A tool already present at the pinned version is kept, so the
# script is idempotent and cheap when warm.
#
# usage: hack/tools.sh tool...   (controller-gen helm kubeconform kustomize kwok)
set -euo pipefail

CACHE="${CACHE:-$HOME/.cache/chimera-test}"
BIN="$CACHE/bin"
GO="${GO:-go}"
mkdir -p "$BIN"

install_tool() { # name module@version
  local name="$1" pkg="$2"
  local stamp="$BIN/.$name.version"
  if [ -x "$BIN/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkg" ]; then
    return 0
  fi
  echo "tools: installing $pkg"
  # Tools are built outside our module so their dependencies never touch go.mod.
  (cd "$BIN" && GOBIN="$BIN" GOFLAGS= nice -n 10 "$GO" install "$pkg")
  echo "$pkg" > "$stamp"
}

for t in "$@"; do
  case "$t" in
    controller-gen) install_tool controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 ;;
    helm)           install_tool helm helm.sh/helm/v3/cmd/helm@v3.22.0 ;;
    kubeconform)    install_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0 ;;
    kustomize)      install_tool kustomize sigs.k8s.io/kustomize/kustomize/v5@v5.8.2 ;;
    kwok)           install_tool kwok sigs.k8s.io/kwok/cmd/kwok@v0.8.0 ;;
    *) echo "tools: unknown tool '$t' (known: controller-gen helm kubeconform kustomize kwok)" >&2; exit 2 ;;
  esac
done
