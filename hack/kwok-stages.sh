#!/usr/bin/env bash
# Writes the kwok stage configuration (node readiness, heartbeats, pod
# lifecycle) that kwok needs to fake nodes and pods, by joining the stage
# files shipped in kwok's own module source at the pinned version.
# usage: hack/kwok-stages.sh OUTFILE   (idempotent)
set -euo pipefail
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
GO="${GO:-go}"
out="$1"
[ -s "$out" ] && exit 0
dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod "$GO" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir/kustomize/stage" ] || { echo "kwok-stages: no stage files in sigs.k8s.io/kwok@$KWOK_VERSION" >&2; exit 1; }
tmp="$out.tmp"
: > "$tmp"
for d in node/fast node/heartbeat pod/fast; do
  for f in "$dir/kustomize/stage/$d"/*.yaml; do
    [ "$(basename "$f")" = kustomization.yaml ] && continue
    printf -- '---\n' >> "$tmp"
    cat "$f" >> "$tmp"
  done
done
mv "$tmp" "$out"
echo "kwok-stages: wrote $out"
