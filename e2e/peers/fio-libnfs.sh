#!/usr/bin/env bash
# Build fio with its libnfs engine from Debian's own fio source and print the
# path of the binary on stdout (progress goes to stderr).
#
# Why: Debian's packaged fio is built without the libnfs engine, and the
# benchmark and the integration tests need a userspace NFS client that does
# not depend on the kernel's (this machine's kernel has no NFS client).
#
# Idempotent: the binary is cached under $CACHE/fio/ and reused when it already
# lists the libnfs engine. No change is made to /etc/apt: the deb-src line
# lives in a private sources list with private package lists.
#
# Use: ioengine=nfs nfs_url=nfs://127.0.0.1/<export>?nfsport=P&mountport=M filename=<file in export>
# (nfs_url names the export to mount; filename is relative to it).
#
# Usage: e2e/peers/fio-libnfs.sh            -> prints e.g. ~/.cache/chimera-test/fio/bin/fio
#        FIO_LIBNFS_REBUILD=1 e2e/peers/fio-libnfs.sh   -> rebuild from scratch
set -euo pipefail

CACHE="${CACHE:-$HOME/.cache/chimera-test}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
fio_root="$CACHE/fio"
fio_bin="$fio_root/bin/fio"
# The Debian release whose fio source we build (the machines run bookworm).
suite="${FIO_DEBIAN_SUITE:-bookworm}"

log() { echo "fio-libnfs: $*" >&2; }

# fio names the libnfs engine "nfs" (ioengine=nfs).
has_libnfs() { [ -x "$1" ] && "$1" --enghelp 2>/dev/null | grep -Eq '^[[:space:]]+nfs$'; }

if [ "${FIO_LIBNFS_REBUILD:-0}" != 1 ] && has_libnfs "$fio_bin"; then
  echo "$fio_bin"
  exit 0
fi

"$repo/scripts/apt-ensure.sh" build-essential pkg-config dpkg-dev libnfs-dev zlib1g-dev libaio-dev >&2

# The mirror the machine already uses (first URIs line of the deb822 sources),
# so the source comes from the same archive as the binaries.
mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
case "$mirror" in http://*debian* | https://*debian*) ;; *) mirror="http://deb.debian.org/debian" ;; esac
mirror="${mirror%/debian-security}"

apt_dir="$fio_root/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$fio_root/src"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
echo "deb-src [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "APT::Sandbox::User=root"
)

src_dir="$(find "$fio_root/src" -maxdepth 1 -type d -name 'fio-*' | sort | tail -n1)"
if [ -z "$src_dir" ] || [ ! -f "$src_dir/configure" ]; then
  log "fetching Debian's fio source from $mirror ($suite)"
  apt-get "${apt_opts[@]}" -qq update >&2
  (cd "$fio_root/src" && apt-get "${apt_opts[@]}" -qq source fio >&2)
  src_dir="$(find "$fio_root/src" -maxdepth 1 -type d -name 'fio-*' | sort | tail -n1)"
fi
[ -n "$src_dir" ] && [ -f "$src_dir/configure" ] || { log "error: fio source not found under $fio_root/src"; exit 1; }

log "building $(basename "$src_dir") with the libnfs engine (a few minutes)"
cd "$src_dir"
# --disable-native: the binary is cached and may run on another CPU model.
./configure --disable-native --enable-libnfs >"$fio_root/configure.log" 2>&1 ||
  { tail -n 30 "$fio_root/configure.log" >&2; log "error: configure failed (log: $fio_root/configure.log)"; exit 1; }
grep -Eq '^NFS engine +yes' "$fio_root/configure.log" ||
  { grep -i nfs "$fio_root/configure.log" >&2 || true; log "error: configure did not enable the libnfs engine (is libnfs-dev installed?)"; exit 1; }
nice -n 10 make -j"$(nproc)" fio >"$fio_root/make.log" 2>&1 ||
  { tail -n 30 "$fio_root/make.log" >&2; log "error: make failed (log: $fio_root/make.log)"; exit 1; }

mkdir -p "$fio_root/bin"
install -m 0755 fio "$fio_bin.tmp"
mv -f "$fio_bin.tmp" "$fio_bin"
has_libnfs "$fio_bin" || { log "error: built fio does not list the libnfs engine"; exit 1; }
# The source tree is kept: the external engine compiles against its headers.
ln -sfn "$src_dir" "$fio_root/source"
log "built $("$fio_bin" --version)"
echo "$fio_bin"
