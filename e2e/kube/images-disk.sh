#!/usr/bin/env bash
# Build the node's images disk: an ext4 image holding a containerd store
# (namespace k8s.io, overlayfs snapshots already unpacked) with the given OCI
# archives imported. The guest mounts it at /var/lib/containerd, so its
# kubelet runs our images with imagePullPolicy Never and no registry; doing
# the import here instead of at boot saves ~13 s per boot.
#
# The import runs in a throwaway containerd on the host: its own root, state
# and socket under a temporary directory, CRI off, killed on exit.
#
# Cached: $CACHE/kube/images-<key>.img, <key> hashing this script and each
# archive's name, size and mtime. Prints the image path on the last line.
#
# usage: images-disk.sh ARCHIVE.tar...
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
kube_cache=$CACHE/kube
SLACK_MB=1024            # room for containers' writable layers during a run
START_TIMEOUT_S=30       # throwaway containerd start

log() { echo "kube-images: $*" >&2; }
die() { echo "kube-images: ERROR: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: images-disk.sh ARCHIVE.tar..."
for a in "$@"; do [ -s "$a" ] || die "image archive '$a' does not exist"; done
"$repo/scripts/apt-ensure.sh" containerd e2fsprogs >&2

mkdir -p "$kube_cache"
key=$(cat "$0" <(stat -L -c '%n %s %Y' "$@") | sha256sum | cut -c1-16)
img=$kube_cache/images-$key.img
if [ -s "$img" ]; then log "cached: $img"; echo "$img"; exit 0; fi

work=$(mktemp -d "$kube_cache/images-build.XXXXXX")
ctrd_pid=""
cleanup() {
  if [ -n "$ctrd_pid" ]; then kill "$ctrd_pid" 2>/dev/null || true; wait "$ctrd_pid" 2>/dev/null || true; fi
  # overlay mounts the import may have left (it unmounts its own on success)
  { grep -o " $work/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work"
  return 0
}
trap cleanup EXIT
store=$work/store
sock=$work/containerd.sock
mkdir -p "$store" "$work/state"
cat >"$work/config.toml" <<EOF
version = 2
root = "$store"
state = "$work/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
EOF
containerd --config "$work/config.toml" >"$work/containerd.log" 2>&1 &
ctrd_pid=$!
deadline=$((SECONDS + START_TIMEOUT_S))
until ctr -a "$sock" version >/dev/null 2>&1; do
  kill -0 "$ctrd_pid" 2>/dev/null || { tail -20 "$work/containerd.log" >&2; die "throwaway containerd exited"; }
  [ $SECONDS -lt $deadline ] || die "throwaway containerd did not answer in ${START_TIMEOUT_S}s"
  sleep 0.2
done
for a in "$@"; do
  log "importing $(basename "$a")"
  ctr -a "$sock" -n k8s.io images import --snapshotter overlayfs "$a" >&2 \
    || die "ctr import of $a failed"
done
names=$(ctr -a "$sock" -n k8s.io images ls -q)
log "store holds: $(echo $names)"
[ -n "$names" ] || die "no image in the store after import"
kill "$ctrd_pid"; wait "$ctrd_pid" 2>/dev/null || true; ctrd_pid=""

size_mb=$(( $(du -sm "$store" | cut -f1) + SLACK_MB ))
mkfs.ext4 -q -F -L chimera-images -d "$store" "$work/images.img" "${size_mb}M" >&2
mv "$work/images.img" "$img"
find "$kube_cache" -maxdepth 1 -name 'images-*.img' ! -name "images-$key.img" -mmin +60 -delete
log "built $img (${size_mb} MB)"
echo "$img"
