#!/bin/sh
# PID 1 of the guest Kubernetes node (after the initramfs switch_root).
# Mounts, modules and sysctls a kubelet + containerd node needs, the host's
# share (/run/kube: kubelet config, credentials; logs go back there), the
# images disk (/dev/vdb: containerd's store, filled on the host by
# images-disk.sh), then containerd and the kubelet (in a restart loop: about
# one start in six hit a start-up crash in the kubelet that a restart clears).
# The host ends the node by killing QEMU; nothing here needs to survive it.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "node-init: $*" >/dev/console; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || say "cgroup controller $c not enabled"
done
# Bidirectional mount propagation (the CSI node plugin's mounts reaching pods)
# needs shared mounts.
mount --make-rshared /
hostname localhost

for m in virtio_net 9p 9pnet_virtio overlay br_netfilter veth bridge nf_conntrack nf_nat nf_tables \
    nft_compat nft_chain_nat xt_nat xt_MASQUERADE xt_conntrack xt_addrtype xt_comment xt_mark \
    nf_conntrack_netlink sunrpc nfs nfsv4 nfs_layout_flexfiles fuse; do
  modprobe "$m" 2>/dev/null || say "modprobe $m failed"
done
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
sysctl -qw kernel.panic=10

ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0

mkdir -p /run/kube
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 kube /run/kube; then
  say "FATAL: the host share 'kube' did not mount"; poweroff -f
fi
mkdir -p /run/kube/logs
if [ -b /dev/vdb ]; then
  mount -t ext4 /dev/vdb /var/lib/containerd || { say "FATAL: cannot mount the images disk"; poweroff -f; }
else
  say "no images disk (/dev/vdb): containerd starts empty"
fi

# No kube-proxy here: the one Service pods need is the apiserver's
# (KUBERNETES_SERVICE_HOST, the first address of the service range), so the
# node rewrites it to the host's apiserver and masquerades pod traffic
# towards the host (slirp answers only its own network).
iptables -t nat -A PREROUTING -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.0.2.2:6443
iptables -t nat -A OUTPUT -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.0.2.2:6443
iptables -t nat -A POSTROUTING -s 10.88.0.0/24 -d 10.0.2.0/24 -j MASQUERADE || say "iptables rules failed"

# The run's PersistentVolume disk (run.sh), for hostPath volumes.
mkdir -p /var/lib/chimera-pv
# By label, found with util-linux's blkid: the mount first on PATH is
# busybox's, which has no -L.
pv_dev=$(/sbin/blkid -L chimera-pv 2>/dev/null || true)
if [ -z "$pv_dev" ]; then
  say "no PV disk (no block device labelled chimera-pv): hostPath volumes land on the root disk"
elif ! mount -t ext4 "$pv_dev" /var/lib/chimera-pv; then
  say "the PV disk $pv_dev (label chimera-pv) did not mount: hostPath volumes land on the root disk"
else
  say "PV disk $pv_dev mounted at /var/lib/chimera-pv ($(df -h /var/lib/chimera-pv | tail -1))"
fi

# Service addresses the test maps to pods (there is no kube-proxy): the
# host-side test writes "VIP POD-IP" lines to /run/kube/vips; each change is
# applied as DNAT rules (for the node's own traffic and for pods') and
# acknowledged in /run/kube/vips.applied. Pod traffic to a VIP that lands on
# another pod of the bridge is masqueraded, so the reply comes back the way
# it went.
iptables -t nat -N CHIMERA-VIPS
iptables -t nat -A PREROUTING -j CHIMERA-VIPS
iptables -t nat -A OUTPUT -j CHIMERA-VIPS
iptables -t nat -A POSTROUTING -m conntrack --ctstate DNAT -s 10.88.0.0/24 -d 10.88.0.0/24 -j MASQUERADE
(
  while :; do
    if [ -f /run/kube/vips ] && ! cmp -s /run/kube/vips /run/vips.cur; then
      cp /run/kube/vips /run/vips.new
      touch /run/vips.cur
      iptables -t nat -F CHIMERA-VIPS
      # The old VIPs' routes go, and connections to them must not keep their
      # old translation (the NFS client reconnects from the same port: its
      # SYNs would follow the old entry to the gone pod until it timed out).
      while read -r vip to; do
        [ -n "$vip" ] || continue
        ip route del "$vip/32" dev cni0 2>/dev/null || true
        conntrack -D -p tcp --orig-dst "$vip" >/dev/null 2>&1 || true
      done </run/vips.cur
      # The node has no default route: the node's own connections (the CSI
      # node plugin's kernel mounts) need one to the VIP before OUTPUT's DNAT
      # sends them to the pod on the bridge.
      while read -r vip to; do
        [ -n "$vip" ] || continue
        iptables -t nat -A CHIMERA-VIPS -d "$vip/32" -p tcp -j DNAT --to-destination "$to"
        ip route replace "$vip/32" dev cni0 || say "no route to VIP $vip (cni0 missing?)"
      done </run/vips.new
      mv /run/vips.new /run/vips.cur
      cp /run/vips.cur /run/kube/vips.applied.tmp && mv /run/kube/vips.applied.tmp /run/kube/vips.applied
      say "VIPs: $(tr '\n' ';' </run/vips.cur)"
    fi
    sleep 1
  done
) &

containerd --config /etc/containerd/config.toml >/run/kube/logs/containerd.log 2>&1 &
i=0
while [ ! -S /run/containerd/containerd.sock ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -S /run/containerd/containerd.sock ] || say "containerd did not start (see logs/containerd.log)"
say "containerd up; images: $(ctr -n k8s.io images ls -q 2>/dev/null | tr '\n' ' ')"
# A second tag of the same chimerad image: what the rolling upgrade changes
# spec.image to (a new revision, nothing to pull).
ctr -n k8s.io images tag localhost/chimerad:dev localhost/chimerad:dev2 >/dev/null 2>&1 || say "could not tag localhost/chimerad:dev2"

(
  n=0
  while :; do
    n=$((n + 1))
    say "kubelet start $n"
    kubelet --config=/run/kube/kubelet.yaml --kubeconfig=/run/kube/kubelet.kubeconfig \
      --hostname-override=localhost --node-ip=10.0.2.15 --v=1 >>/run/kube/logs/kubelet.log 2>&1
    say "kubelet exited ($?)"
    sleep 1
  done
) &
# The NFS client's tracepoints, for a step that asks (the rolling upgrade):
# the host creates nfs-trace.on to start them (a bounded ring buffer) and
# nfs-trace.dump to have the buffer (then emptied), the kernel log and
# mountstats copied to logs/ (nfs-trace.done says it is there).
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
T=/sys/kernel/tracing
nfs_trace() {
  if [ -e /run/kube/nfs-trace.on ] && [ ! -e /run/nfs-trace.enabled ]; then
    echo 8192 >$T/buffer_size_kb
    for ev in nfs4 nfs; do echo 1 >"$T/events/$ev/enable" || say "no $ev tracepoints"; done
    echo 1 >$T/tracing_on
    : >/run/nfs-trace.enabled
    say "NFS client tracepoints on"
  fi
  if [ -e /run/kube/nfs-trace.dump ]; then
    cat $T/trace >/run/kube/logs/nfs-trace.txt
    : >$T/trace
    dmesg >/run/kube/logs/dmesg.txt
    cat /proc/self/mountstats >/run/kube/logs/mountstats.txt
    rm -f /run/kube/nfs-trace.dump
    : >/run/kube/logs/nfs-trace.done
  fi
}
# The host-side test reads the node's NFS mounts from here (no pod needed).
(
  while :; do
    grep -E ' nfs4? ' /proc/mounts >/run/kube/nfs-mounts.tmp
    mv -f /run/kube/nfs-mounts.tmp /run/kube/nfs-mounts
    nfs_trace
    sleep 1
  done
) &
say "node up"
while :; do sleep 3600; done
