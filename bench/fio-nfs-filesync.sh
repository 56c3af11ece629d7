#!/usr/bin/env bash
# Build fio's libnfs engine as an external engine whose WRITEs are FILE_SYNC
# (bench/fio_nfs_filesync.c says how) and print the .so's path on stdout.
# Use: fio --ioengine=external:<path> --nfs_url=... (same options as ioengine=nfs).
#
# Needs the fio source tree e2e/peers/fio-libnfs.sh keeps; the result is cached
# next to it and rebuilt when the shim or the source changes. Idempotent.
set -euo pipefail

CACHE="${CACHE:-$HOME/.cache/chimera-test}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
"$repo/e2e/peers/fio-libnfs.sh" >/dev/null
src="$CACHE/fio/source"
out="$CACHE/fio/nfs-filesync.so"
shim="$here/fio_nfs_filesync.c"
[ -f "$src/engines/nfs.c" ] && [ -f "$src/config-host.h" ] ||
  { echo "fio-nfs-filesync: fio source tree not found at $src" >&2; exit 1; }
if [ -f "$out" ] && [ "$out" -nt "$shim" ] && [ "$out" -nt "$src/engines/nfs.c" ]; then
  echo "$out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The same defines fio's Makefile builds with: the structs fio shares with an
# engine (thread_data, fio_file) must have the same layout on both sides.
defs=(-D_LARGEFILE_SOURCE -D_FILE_OFFSET_BITS=64 -D_GNU_SOURCE -DFIO_INTERNAL -std=gnu99)
cc -O2 -fPIC "${defs[@]}" -include "$src/config-host.h" -I"$src" \
  -Dnfs_open=chimera_filesync_nfs_open -Dregister_ioengine=chimera_filesync_register \
  -Dunregister_ioengine=chimera_filesync_unregister -c "$src/engines/nfs.c" -o "$tmp/nfs.o"
cc -O2 -fPIC -c "$shim" -o "$tmp/shim.o"
cc -shared "$tmp/nfs.o" "$tmp/shim.o" -lnfs -o "$tmp/nfs-filesync.so"
mv -f "$tmp/nfs-filesync.so" "$out"
echo "$out"
