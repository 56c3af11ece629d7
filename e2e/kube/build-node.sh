#!/usr/bin/env bash
# Build the guest Kubernetes node: an ext4 root disk holding busybox, kmod,
# util-linux, iptables (nft), Debian's containerd + runc + CNI plugins, the
# kernel's modules and our kubelet; plus a ~2 MB initramfs that loads virtio
# and ext4 and switch_roots into that disk (runc's pivot_root fails on an
# initramfs root, so the node needs a real root filesystem).
#
# Cached: $CACHE/kube/node-<key>/{vmlinuz,initrd.img,root.img} where <key>
# hashes this script, node-init.sh and the kubelet binary. Downloaded .debs
# are kept in $CACHE/kube/debs/. Prints the node directory on the last line.
#
# usage: build-node.sh KUBELET_BIN
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
kube_cache=$CACHE/kube
deb_dir=$kube_cache/debs
ROOT_SLACK_MB=512        # free space on the root for kubelet state and pod logs

log() { echo "kube-node: $*" >&2; }
die() { echo "kube-node: ERROR: $*" >&2; exit 1; }

kubelet=${1:-}
[ -x "$kubelet" ] || die "usage: build-node.sh KUBELET_BIN (got '${kubelet}')"
"$repo/scripts/apt-ensure.sh" qemu-system-x86 zstd cpio busybox-static kmod e2fsprogs >&2

kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[[ "$kernel_pkg" =~ ^linux-image-([0-9][0-9a-z.+-]*-amd64)$ ]] || die "cannot resolve the kernel package (got '$kernel_pkg')"
kver=${BASH_REMATCH[1]}

key=$(cat "$0" "$here/node-init.sh" "$here/initramfs-init.sh" <(echo "$kernel_pkg") <(sha256sum <"$kubelet") | sha256sum | cut -c1-16)
node=$kube_cache/node-$key
if [ -s "$node/root.img" ] && [ -s "$node/initrd.img" ] && [ -s "$node/vmlinuz" ]; then
  log "cached: $node"
  echo "$node"
  exit 0
fi
log "building node $key (kernel $kver)"
mkdir -p "$deb_dir"

# Whole packages are unpacked into the root (Debian's own non-merged layout:
# /bin, /lib, /usr/...), so their files sit where their binaries expect them.
tools_pkgs=(busybox-static kmod mount util-linux iptables conntrack containerd runc containernetworking-plugins
  libc6 libgcc-s1)
lib_pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${tools_pkgs[@]}" 2>/dev/null \
  | grep -E '^lib|^zlib1g$' | grep -vE '^lib.*-(perl|dev)$|^libperl|^libpython|^libpam|^libsystemd|^libudev|^libaudit|^libdb' | sort -u)
mapfile -t pkgs < <(printf '%s\n' "$kernel_pkg" "${tools_pkgs[@]}" $lib_pkgs | sort -u)

declare -A debs=()
while read -r p v; do
  [ -n "$v" ] && [ "$v" != "(none)" ] || die "package $p has no install candidate"
  debs[$p]="${p}_${v//:/%3a}_"
done < <(apt-cache policy "${pkgs[@]}" | awk '/^[^ ].*:$/ {p = substr($1, 1, length($1) - 1)} /Candidate:/ {print p, $2}')
missing=()
for p in "${pkgs[@]}"; do
  [ -n "${debs[$p]:-}" ] || die "apt-cache policy knows no package $p"
  f=$(ls "$deb_dir/${debs[$p]}"*.deb 2>/dev/null | head -n1 || true)
  # The guest harness may already hold it (the kernel is 68 MB).
  if [ -z "$f" ]; then
    g=$(ls "$CACHE/guest/debs/${debs[$p]}"*.deb 2>/dev/null | head -n1 || true)
    if [ -n "$g" ]; then cp "$g" "$deb_dir/"; f=$deb_dir/$(basename "$g"); fi
  fi
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

work=$(mktemp -d "$kube_cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root" "$work/out"
for p in "${pkgs[@]}"; do dpkg-deb -x "${debs[$p]}" "$root"; done
mv "$root/boot/vmlinuz-$kver" "$work/out/vmlinuz"
rm -rf "$root/boot" "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/locale" "$root/usr/share/info"

# Modules the node never loads (graphics, sound, wireless, USB, ...): ~250 MB.
mroot=$root/lib/modules/$kver
for d in drivers/gpu drivers/media drivers/net/wireless drivers/staging drivers/usb drivers/bluetooth \
         drivers/hid drivers/iio drivers/input drivers/infiniband drivers/scsi drivers/net/ethernet \
         drivers/mmc drivers/isdn drivers/hwmon drivers/platform drivers/mtd sound net/wireless net/mac80211 \
         net/bluetooth; do
  rm -rf "${mroot:?}/kernel/$d"
done
depmod -b "$root" "$kver"

# busybox fills in every tool no package provides (sh, ip, sysctl, ...).
for a in $("$root/bin/busybox" --list-full); do
  [ -e "$root/$a" ] || [ -L "$root/$a" ] || { mkdir -p "$root/$(dirname "$a")"; ln -s /bin/busybox "$root/$a"; }
done
[ -e "$root/sbin/modprobe" ] || ln -sf /bin/kmod "$root/sbin/modprobe"
for a in modprobe insmod rmmod lsmod depmod modinfo; do ln -sf /bin/kmod "$root/sbin/$a"; done
# iptables: the nft flavour (the legacy one needs ip_tables modules kubelet
# does not load); Debian sets this through update-alternatives at install.
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf /usr/sbin/xtables-nft-multi "$root/usr/sbin/$t"
done

# Every dynamic binary the node runs must resolve inside the root.
for b in usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/sbin/runc usr/sbin/xtables-nft-multi \
         bin/kmod bin/mount sbin/losetup usr/bin/nsenter; do
  [ -e "$root/$b" ] || die "$b missing from the unpacked packages"
  if ldd "$root/$b" >/dev/null 2>&1; then
    out=$(LD_LIBRARY_PATH=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu ldd "$root/$b" 2>&1)
    while read -r name _ path _; do
      [ "$path" = "not" ] && die "$b needs $name, which no unpacked package has"
      case "$path" in "$root"/*) ;; /*) die "$b resolves $name outside the root ($path): add its package" ;; esac
    done < <(grep '=>' <<<"$out")
  fi
done

install -m 0755 "$kubelet" "$root/usr/bin/kubelet"
install -m 0755 "$here/node-init.sh" "$root/sbin/node-init"
mkdir -p "$root"/{proc,sys,dev,run,tmp,root,var/lib/kubelet,var/lib/containerd,var/log,etc/cni/net.d,etc/containerd,etc/kubernetes,opt/cni}
ln -sfn /usr/lib/cni "$root/opt/cni/bin"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'localhost\n' >"$root/etc/hostname"
printf "c0ffee00c0ffee00c0ffee00c0ffee00\n" >"$root/etc/machine-id"   # cadvisor wants one
printf '127.0.0.1 localhost\n10.0.2.2 host\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"
printf 'ip 0 IP\nicmp 1 ICMP\ntcp 6 TCP\nudp 17 UDP\n' >"$root/etc/protocols"
: >"$root/etc/fstab"
# containerd: CRI with runc under cgroupfs, overlayfs snapshots, our local pause image.
cat >"$root/etc/containerd/config.toml" <<'EOF'
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
# One bridge for every pod, no masquerade: the guest has no default route, so
# pods reach only the node, each other and (through the node) the host.
cat >"$root/etc/cni/net.d/10-chimera.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "chimera-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# The initramfs: busybox and the modules that reach the root disk.
ird=$work/initrd
mkdir -p "$ird"/{bin,sbin,proc,sys,dev,newroot,lib/modules/$kver}
cp "$root/bin/busybox" "$ird/bin/busybox"
for m in virtio_pci virtio_blk ext4 crc32c_generic; do
  modprobe -d "$root" -S "$kver" --show-depends "$m" 2>/dev/null | while read -r kind path _; do
    [ "$kind" = insmod ] || continue
    rel=${path#"$root"/lib/modules/"$kver"/}
    mkdir -p "$ird/lib/modules/$kver/$(dirname "$rel")"
    cp "$path" "$ird/lib/modules/$kver/$rel"
  done
done
cp "$mroot"/modules.order "$mroot"/modules.builtin* "$ird/lib/modules/$kver/"
depmod -b "$ird" "$kver"
install -m 0755 "$here/initramfs-init.sh" "$ird/init"
(cd "$ird" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) | zstd -q -19 >"$work/out/initrd.img"

size_mb=$(( $(du -sm "$root" | cut -f1) + ROOT_SLACK_MB ))
mkfs.ext4 -q -F -L chimera-node -d "$root" "$work/out/root.img" "${size_mb}M" >&2
echo "$kver" >"$work/out/KERNEL"
rm -rf "$node"
mv "$work/out" "$node"
find "$kube_cache" -maxdepth 1 -name 'node-*' ! -name "node-$key" -mmin +60 -exec rm -rf {} +
log "built $node: root $(du -h --apparent-size "$node/root.img" | cut -f1), initrd $(du -h "$node/initrd.img" | cut -f1)"
echo "$node"
