#!/usr/bin/env bash
# Link the fio engine: engine.c (compiled against the headers of the fio
# e2e/peers/fio-libnfs.sh builds) + this crate's static library -> one .so
# that fio loads with --ioengine=external:<path>. `make build-fio-engine`
# builds the static library first and calls this.
#
# Usage: build-engine.sh LIBCHIMERA_FIO_A OUT_SO
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: build-engine.sh LIBCHIMERA_FIO_A OUT_SO" >&2; exit 2; }
lib=$1
out=$2
CACHE="${CACHE:-$HOME/.cache/chimera-test}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
[ -f "$lib" ] || { echo "build-engine: $lib is missing (cargo build --release -p fio-engine)" >&2; exit 1; }
"$repo/e2e/peers/fio-libnfs.sh" >/dev/null
src="$CACHE/fio/source"
[ -f "$src/fio.h" ] && [ -f "$src/config-host.h" ] ||
  { echo "build-engine: fio source tree not found at $src (e2e/peers/fio-libnfs.sh keeps it)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The same defines fio's Makefile builds with: thread_data, fio_file and
# io_u must have fio's layout here.
defs=(-D_LARGEFILE_SOURCE -D_FILE_OFFSET_BITS=64 -D_GNU_SOURCE -DFIO_INTERNAL -std=gnu99)
cc -O2 -fPIC -Wall "${defs[@]}" -include "$src/config-host.h" -I"$src" -I"$here/include" -c "$here/engine.c" -o "$tmp/engine.o"
# Only fio's entry point leaves the .so: the Rust runtime's symbols stay
# inside and cannot clash with fio's or another engine's.
printf '{ global: ioengine; local: *; };\n' >"$tmp/exports.map"
cc -shared -Wl,--version-script="$tmp/exports.map" -Wl,--gc-sections -o "$tmp/engine.so" "$tmp/engine.o" "$lib" -lpthread -ldl -lm
mkdir -p "$(dirname "$out")"
mv -f "$tmp/engine.so" "$out"
echo "$out"
