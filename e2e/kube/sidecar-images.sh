#!/usr/bin/env bash
# Package the CSI sidecar stand-ins (sidecars/, one static binary) as an OCI
# archive holding four images, one per sidecar the chart runs, that differ
# only in their entrypoint:
#   localhost/chimera-e2e-provisioner:dev    localhost/chimera-e2e-resizer:dev
#   localhost/chimera-e2e-registrar:dev      localhost/chimera-e2e-livenessprobe:dev
# Written by hand (layer tar, config, manifests, index): one file layer needs
# no image builder. `ctr images import` names each image from its
# io.containerd.image.name annotation.
#
# usage: sidecar-images.sh BINARY OUT.tar
set -euo pipefail

bin=${1:-}; out=${2:-}
[ -x "$bin" ] && [ -n "$out" ] || { echo "usage: sidecar-images.sh BINARY OUT.tar" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
blobs=$work/oci/blobs/sha256
mkdir -p "$work/rootfs/tmp" "$blobs"
chmod 1777 "$work/rootfs/tmp"
install -m 0755 "$bin" "$work/rootfs/chimera-e2e-sidecar"
# The chart's registrar liveness probe executes this path.
ln -s chimera-e2e-sidecar "$work/rootfs/csi-node-driver-registrar"

put() {  # file -> prints "digest size" after storing it as a blob
  local d
  d=$(sha256sum "$1" | cut -d' ' -f1)
  mv "$1" "$blobs/$d"
  echo "$d $(stat -c %s "$blobs/$d")"
}
tar -C "$work/rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
read -r layer layer_size < <(put "$work/layer.tar")

manifests=""
for mode in provisioner resizer registrar livenessprobe; do
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/chimera-e2e-sidecar","%s"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$mode" "$layer" >"$work/config.json"
  read -r cfg cfg_size < <(put "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg" "$cfg_size" "$layer" "$layer_size" >"$work/manifest.json"
  read -r man man_size < <(put "$work/manifest.json")
  name=localhost/chimera-e2e-$mode:dev
  manifests+="${manifests:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$man\",\"size\":$man_size,\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"dev\"}}"
done
printf '{"schemaVersion":2,"manifests":[%s]}' "$manifests" >"$work/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
tar -C "$work/oci" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tmp" .
# Unchanged content keeps its mtime, so the images disk stays cached.
if cmp -s "$out.tmp" "$out"; then rm -f "$out.tmp"; else mv "$out.tmp" "$out"; fi
echo "$out"
