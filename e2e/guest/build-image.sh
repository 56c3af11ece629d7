#!/usr/bin/env bash
# Build the QEMU guest used by the kernel-client tests: Debian's kernel plus an
# initramfs holding busybox, the NFS/RDMA/VFIO user tools with their library
# closure, and the kernel modules they need.
#
# Idempotent and cached: the image lands in $CACHE/guest/img-<key>/, where <key>
# hashes this script, the init script, the lock helper and the exact kernel
# package name. Downloaded .debs are kept in $CACHE/guest/debs/ and reused.
# Prints the image directory (holding vmlinuz and initrd.img) on the last line
# of stdout, so callers can do `dir=$(build-image.sh | tail -n1)`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
guest_cache=$CACHE/guest
deb_dir=$guest_cache/debs
mkdir -p "$deb_dir"

log() { echo "guest-image: $*" >&2; }
die() { echo "guest-image: ERROR: $*" >&2; exit 1; }

# Host tools: qemu to boot, zstd/cpio to pack, busybox (host copy only used as
# the cpio writer), gcc for the static lock helper.
"$repo/scripts/apt-ensure.sh" qemu-system-x86 qemu-utils zstd cpio busybox-static kmod gcc libc6-dev >&2

# The kernel: the exact versioned package linux-image-amd64 points at (naming
# the meta package would make apt-get download fetch only the meta package).
kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[[ "$kernel_pkg" =~ ^linux-image-([0-9][0-9a-z.+-]*-amd64)$ ]] || die "cannot resolve the kernel package from linux-image-amd64 (got '$kernel_pkg')"
kver=${BASH_REMATCH[1]}

key=$(cat "$0" "$here/init.sh" "$here/lockhelper.c" "$here/filehelper.c" <(echo "$kernel_pkg") | sha256sum | cut -c1-16)
img=$guest_cache/img-$key
if [ -s "$img/initrd.img" ] && [ -s "$img/vmlinuz" ]; then
  log "cached: $img"
  echo "$img"
  exit 0
fi
log "building image $key (kernel $kver)"

# User-space packages the guest runs, and the library packages of their
# dependency closure (recursive Depends, restricted to lib*; the ldd pass below
# fails loudly if a needed library is not among them).
tools_pkgs=(busybox-static dash mount nfs-common kmod iproute2 rdma-core ibverbs-utils ibverbs-providers
  rdmacm-utils perftest fio util-linux pciutils libtirpc-common)
lib_pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${tools_pkgs[@]}" 2>/dev/null \
  | grep -E '^lib|^zlib1g$' | grep -vE '^lib.*-(perl|dev)$|^libperl|^libpython' | sort -u)
mapfile -t pkgs < <(printf '%s\n' "$kernel_pkg" "${tools_pkgs[@]}" $lib_pkgs | sort -u)

# Download what is missing (apt-get download names files pkg_version_arch.deb,
# with the epoch's ':' escaped). One apt-cache call for all candidates: it is
# slow on a loaded box.
declare -A debs=()
while read -r p v; do
  [ -n "$v" ] && [ "$v" != "(none)" ] || die "package $p has no install candidate"
  debs[$p]="${p}_${v//:/%3a}_"
done < <(apt-cache policy "${pkgs[@]}" | awk '/^[^ ].*:$/ {p = substr($1, 1, length($1) - 1)} /Candidate:/ {print p, $2}')
missing=()
for p in "${pkgs[@]}"; do
  [ -n "${debs[$p]:-}" ] || die "apt-cache policy knows no package $p"
  f=$(ls "$deb_dir/${debs[$p]}"*.deb 2>/dev/null | head -n1 || true)
  if [ -n "$f" ]; then debs[$p]=$f; else missing+=("$p"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "downloading ${#missing[@]} packages"
  (cd "$deb_dir" && apt-get download -q "${missing[@]}" >&2) || die "apt-get download failed"
  for p in "${missing[@]}"; do
    f=$(ls "$deb_dir/${debs[$p]}"*.deb 2>/dev/null | head -n1 || true)
    [ -n "$f" ] || die "apt-get download did not produce ${debs[$p]}*.deb"
    debs[$p]=$f
  done
fi

work=$(mktemp -d "$guest_cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage   # every package unpacked: the pool we pick files from
root=$work/root     # the initramfs tree
mkdir -p "$stage" "$root" "$work/out"
for p in "${pkgs[@]}"; do dpkg-deb -x "${debs[$p]}" "$stage"; done

# Layout: usr-merged, libraries flattened into one directory.
mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,etc,proc,sys,dev,tmp,run,mnt,results,test,var/lib/nfs,root,opt/extra}
ln -s usr/bin "$root/bin"; ln -s usr/sbin "$root/sbin"; ln -s usr/lib "$root/lib"
mkdir -p "$root/lib64"
libdir=$root/usr/lib/x86_64-linux-gnu

# busybox provides the shell and the small tools (sha256sum, dd, base64, ...).
cp "$stage/bin/busybox" "$root/usr/bin/busybox"
for a in $("$stage/bin/busybox" --list); do
  [ -e "$root/usr/bin/$a" ] || ln -s busybox "$root/usr/bin/$a"
done

# Real tools that replace busybox applets (full option support) or add features.
find_in_stage() {
  local n=$1 d
  for d in usr/sbin sbin usr/bin bin; do
    [ -f "$stage/$d/$n" ] && { echo "$stage/$d/$n"; return 0; }
  done
  return 1
}
bins=(dash mount umount mount.nfs kmod ip rdma ibv_devices ibv_devinfo ibv_rc_pingpong rping ucmatose
  ib_send_lat ib_read_lat ib_send_bw ib_write_bw flock unshare nsenter lspci setpci nfsstat fallocate)
bin_paths=()
for b in "${bins[@]}"; do
  p=$(find_in_stage "$b") || die "tool $b not found in the staged packages"
  case "$(head -c2 "$p")" in
    '#!') log "skipping script $b (no interpreter in the guest)"; continue ;;
  esac
  rm -f "$root/usr/sbin/$b" "$root/usr/bin/$b"
  cp "$p" "$root/usr/sbin/$b"
  bin_paths+=("$p")
done
ln -sf mount.nfs "$root/usr/sbin/mount.nfs4"
for a in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf kmod "$root/usr/sbin/$a"; rm -f "$root/usr/bin/$a"; done

# The static byte-range lock helper (fcntl F_SETLK/F_GETLK), ours.
gcc -static -O2 -Wall -Werror -o "$root/usr/sbin/lockhelper" "$here/lockhelper.c"
# And the file helper (copy_file_range, SEEK_DATA/SEEK_HOLE, xattrs), ours.
gcc -static -O2 -Wall -Werror -o "$root/usr/sbin/filehelper" "$here/filehelper.c"

# rdma-core user-space providers are dlopen()ed: only the software ones the
# guest can use (rxe = soft RoCE, siw = soft iWARP), else libibverbs warns
# about every hardware provider whose library is absent.
mkdir -p "$libdir/libibverbs" "$root/etc/libibverbs.d"
for prov in rxe siw; do
  cp -L "$stage/usr/lib/x86_64-linux-gnu/libibverbs/lib$prov-rdmav34.so" "$libdir/libibverbs/"
  cp "$stage/etc/libibverbs.d/$prov.driver" "$root/etc/libibverbs.d/"
done
cp "$stage/etc/netconfig" "$root/etc/netconfig" || die "/etc/netconfig missing (mount.nfs needs it)"

# Library closure: ldd against the staged libraries only. A library that
# resolves outside the stage means a package is missing from the list above.
stage_libpath=$stage/lib/x86_64-linux-gnu:$stage/usr/lib/x86_64-linux-gnu:$stage/usr/lib/x86_64-linux-gnu/ceph:$stage/usr/lib/x86_64-linux-gnu/libibverbs
copy_closure() {  # $1: destination library directory; $2...: binaries
  local dest=$1 f name path src; shift
  local -A seen=()
  local queue=("$@")
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    while read -r name path; do
      [ -n "${seen[$name]:-}" ] && continue
      seen[$name]=1
      src=""
      for d in "$stage/usr/lib/x86_64-linux-gnu" "$stage/lib/x86_64-linux-gnu"; do
        [ -e "$d/$name" ] && { src=$d/$name; break; }
      done
      # Private library directories reached through RUNPATH (ceph/ for fio's librbd).
      [ -n "$src" ] || src=$(find "$stage/usr/lib/x86_64-linux-gnu" -name "$name" | head -n1)
      [ -n "$src" ] || die "library $name (needed by $(basename "$f")) is in no staged package"
      cp -L "$src" "$dest/$name"
      queue+=("$src")
    done < <(LD_LIBRARY_PATH=$stage_libpath ldd "$f" 2>/dev/null \
             | awk '$2=="=>" && $3 ~ /^\// {print $1, $3} $2=="=>" && $3=="not" {print $1, "missing"}')
  done
}
copy_closure "$libdir" "${bin_paths[@]}" "$libdir"/libibverbs/*.so

# fio (Debian's links librbd, glusterfs and ICU: ~80 MB of libraries) would
# triple the initramfs and the boot time, so it lives in extra/, which run.sh
# shares read-only over 9p and /init mounts at /opt/extra.
extra=$work/out/extra
mkdir -p "$extra/bin" "$extra/lib"
cp "$stage/usr/bin/fio" "$extra/bin/fio"
copy_closure "$extra/lib" "$extra/bin/fio"
cp -L "$stage/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$extra/lib/"
cat >"$root/usr/sbin/fio" <<'WRAP'
#!/bin/sh
# fio and its libraries come from the read-only extra share (see build-image.sh).
[ -x /opt/extra/bin/fio ] || { echo "fio: /opt/extra is not mounted (run.sh shares it)" >&2; exit 127; }
exec /opt/extra/lib/ld-linux-x86-64.so.2 --library-path /opt/extra/lib /opt/extra/bin/fio "$@"
WRAP
chmod 0755 "$root/usr/sbin/fio"

# The loader, and libgcc_s which pthread_cancel dlopen()s.
cp -L "$stage/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$libdir/"
ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
cp -L "$stage/usr/lib/x86_64-linux-gnu/libgcc_s.so.1" "$libdir/" 2>/dev/null \
  || cp -L "$stage/lib/x86_64-linux-gnu/libgcc_s.so.1" "$libdir/"

# Kernel modules: the named ones plus their dependency closure (modprobe
# --show-depends against the staged tree), and all crypto/lib modules because
# rdma_rxe and sunrpc pick their crc32/hash implementations at run time.
# nfs_layout_flexfiles: the pNFS flex-files layout driver (e2e/pnfs);
# fuse: chimera-fuse (the RDMA suite mounts it over RDMA).
mods=(virtio_pci virtio_net virtio_blk 9p 9pnet_virtio nfs nfsv3 nfsv4 sunrpc rpcrdma
  nfs_layout_flexfiles rdma_rxe ib_uverbs rdma_ucm ib_umad nvme vfio_pci vfio_iommu_type1
  loop ext4 overlay fuse)
mstage=$stage/lib/modules/$kver
[ -d "$mstage" ] || die "kernel modules for $kver not found in $kernel_pkg"
depmod -b "$stage" "$kver"
mdst=$root/usr/lib/modules/$kver
mkdir -p "$mdst"
copy_mod() {  # $1: absolute path inside the stage
  local rel=${1#"$stage"/lib/modules/"$kver"/}
  mkdir -p "$mdst/$(dirname "$rel")"
  cp "$1" "$mdst/$rel"
}
for m in "${mods[@]}"; do
  out=$(modprobe -d "$stage" -S "$kver" --show-depends "$m" 2>&1) || die "module $m: $out"
  while read -r kind path _; do
    [ "$kind" = insmod ] && copy_mod "$path"
  done <<<"$out"
done
while read -r f; do copy_mod "$f"; done < <(find "$mstage/kernel/crypto" "$mstage/kernel/arch/x86/crypto" "$mstage/kernel/lib" -name '*.ko*')
cp "$mstage"/modules.order "$mstage"/modules.builtin* "$mdst/"
# depmod -b <root> looks in <root>/lib/modules, which is the usr/lib symlink here.
depmod -b "$root" "$kver"
[ -s "$mdst/modules.dep" ] || die "depmod produced no modules.dep"

# Minimal identity files and the init.
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'localhost\n' >"$root/etc/hostname"
# mount.nfs resolves proto=tcp/rdma and service names through these.
printf 'ip 0 IP\ntcp 6 TCP\nudp 17 UDP\n' >"$root/etc/protocols"
printf 'sunrpc 111/tcp\nnfs 2049/tcp\nnfsrdma 20049/tcp\n' >"$root/etc/services"
: >"$root/etc/fstab"
printf '127.0.0.1 localhost\n10.0.2.2 host\n' >"$root/etc/hosts"
cp "$here/init.sh" "$root/init"
chmod 0755 "$root/init"

# Pack: newc cpio, zstd (the kernel unpacks a concatenation of such archives).
(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) | zstd -q -T2 -9 >"$work/out/initrd.img"
cp "$stage/boot/vmlinuz-$kver" "$work/out/vmlinuz"
echo "$kernel_pkg" >"$work/out/KERNEL"
rm -rf "$img"
mv "$work/out" "$img"
# Older images (other keys) are dead weight: keep only this one.
# (After an hour, so a guest booted from an older one keeps its share.)
find "$guest_cache" -maxdepth 1 -name 'img-*' ! -name "img-$key" -mmin +60 -exec rm -rf {} +
log "built $img: initrd $(du -h "$img/initrd.img" | cut -f1), kernel $kver"
echo "$img"
