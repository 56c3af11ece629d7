#!/bin/sh
# Runs INSIDE the QEMU guest (e2e/guest/run.sh). Proves the node plugin with the
# real kernel NFS client: chimera-csi runs as the node plugin; csicall plays the
# kubelet. NodeStage/NodePublish produce a kernel NFSv4.1 mount of the volume on
# the host's chimerad; bytes written through the pod's mount point are recorded
# for the host to read back over NFS; NodeGetVolumeStats reports the quota; a
# write past the quota fails with EDQUOT; restarting the node plugin leaves the
# mount working; Unpublish/Unstage leave no NFS mount behind.
# Then runs csi-sanity (csi-test v5) including the Node Service specs, which
# cannot run on the host, against the same chimerad.
# Inputs in /results (the 9p share): chimera-csi, csicall, sanity.test,
# volume.json; env CAPACITY_BYTES, ADMIN_URL, ADMIN_TOKEN, NFS_PORT. Outputs: /results/data.sha256, /results/guest.log lines.
set -u
R=/results
fail() { echo "node-in-guest: FAIL: $*"; exit 1; }
step() { echo "node-in-guest: $*"; }

modprobe nfsv4 || fail "modprobe nfsv4"
# mount.nfs resolves proto=tcp through getprotobyname(3); the initramfs may
# carry no /etc/protocols.
[ -s /etc/protocols ] || printf 'ip 0 IP\ntcp 6 TCP\nudp 17 UDP\n' > /etc/protocols
# The guest has busybox mount, whose NFS support is v2/v3 only; route NFS
# mounts to mount.nfs (nfs-utils) and everything else (bind) to busybox, the
# way util-linux mount would.
mkdir -p /tmp/bin
cat > /tmp/bin/mount <<'EOS'
#!/bin/sh
case " $* " in
  *" -t nfs "*|*" -t nfs4 "*)
    opts=""; args=""
    while [ $# -gt 0 ]; do
      case "$1" in -t) shift 2 ;; -o) opts=$2; shift 2 ;; *) args="$args $1"; shift ;; esac
    done
    exec /usr/sbin/mount.nfs $args -o "$opts" ;;
esac
exec /usr/bin/busybox mount "$@"
EOS
chmod +x /tmp/bin/mount
export PATH=/tmp/bin:$PATH

cp $R/chimera-csi $R/csicall /tmp/ && chmod +x /tmp/chimera-csi /tmp/csicall
SOCK=unix:///tmp/csi.sock
K=/var/lib/kubelet
STAGING=$K/plugins/kubernetes.io/csi/csi.chimera.io/vol/globalmount
TARGET=$K/pods/pod-1/volumes/kubernetes.io~csi/pvc-e2e/mount
mkdir -p $K/plugins/kubernetes.io/csi/csi.chimera.io/vol $K/pods/pod-1/volumes/kubernetes.io~csi/pvc-e2e

start_plugin() {
  /tmp/chimera-csi --mode=node --nodeid=guest --endpoint=$SOCK --v=4 >>/tmp/plugin.log 2>&1 &
  PLUGIN=$!
  i=0; while [ ! -S /tmp/csi.sock ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  [ -S /tmp/csi.sock ] || { cat /tmp/plugin.log; fail "node plugin did not start"; }
}
start_plugin

step "NodeStage + NodePublish"
/tmp/csicall -endpoint $SOCK publish -volume $R/volume.json -staging $STAGING -target $TARGET || { cat /tmp/plugin.log; fail "publish"; }
grep " $STAGING nfs4 " /proc/mounts | grep -q "vers=4.1" || { cat /proc/mounts; fail "staging is not an NFSv4.1 mount"; }
grep -q " $TARGET nfs4 " /proc/mounts || { cat /proc/mounts; fail "target is not mounted"; }
grep " $STAGING " /proc/mounts

step "write through the pod's mount point"
dd if=/dev/urandom of=/tmp/data bs=64k count=16 2>/dev/null
cp /tmp/data $TARGET/data || fail "write through $TARGET"
sync
sha256sum < /tmp/data | cut -d' ' -f1 > $R/data.sha256
[ "$(sha256sum < $TARGET/data | cut -d' ' -f1)" = "$(cat $R/data.sha256)" ] || fail "read back differs"

step "NodeGetVolumeStats reports the quota"
/tmp/csicall -endpoint $SOCK stats -volume $R/volume.json -path $TARGET > /tmp/stats || fail "stats"
cat /tmp/stats
total=$(sed -n 's/^BYTES total=\([0-9]*\).*/\1/p' /tmp/stats)
[ "$total" = "$CAPACITY_BYTES" ] || fail "stats total $total, want the quota $CAPACITY_BYTES"

step "a write past the quota fails with EDQUOT"
if dd if=/dev/zero of=$TARGET/big bs=1M count=$((CAPACITY_BYTES / 1048576 + 2)) conv=fsync 2>/tmp/dd.err; then
  fail "writing past the quota succeeded"
fi
cat /tmp/dd.err
grep -qi "quota" /tmp/dd.err || fail "write past the quota failed, but not with EDQUOT"
rm -f $TARGET/big

step "restart the node plugin: the mount keeps working"
kill $PLUGIN; wait $PLUGIN 2>/dev/null
start_plugin
[ "$(sha256sum < $TARGET/data | cut -d' ' -f1)" = "$(cat $R/data.sha256)" ] || fail "data unreadable after plugin restart"
echo after-restart > $TARGET/after || fail "write after plugin restart"
/tmp/csicall -endpoint $SOCK publish -volume $R/volume.json -staging $STAGING -target $TARGET || fail "publish retry after restart"
[ "$(grep -c " $TARGET " /proc/mounts)" = 1 ] || fail "publish retry mounted twice"

step "NodeUnpublish + NodeUnstage leave no mount"
/tmp/csicall -endpoint $SOCK unpublish -volume $R/volume.json -staging $STAGING -target $TARGET || fail "unpublish"
/tmp/csicall -endpoint $SOCK unpublish -volume $R/volume.json -staging $STAGING -target $TARGET || fail "unpublish retry"
if grep -q " nfs4 " /proc/mounts; then cat /proc/mounts; fail "NFS mounts left"; fi
kill $PLUGIN

step "csi-sanity with the node specs, real kernel NFS mounts"
cp $R/sanity.test /tmp/ && chmod +x /tmp/sanity.test
( cd /tmp && CHIMERA_SANITY_NODE=1 CHIMERA_ADMIN_URL=$ADMIN_URL CHIMERA_ADMIN_TOKEN=$ADMIN_TOKEN \
    CHIMERA_NFS_SERVER=10.0.2.2 CHIMERA_NFS_PORT=$NFS_PORT \
    /tmp/sanity.test -test.v -test.run TestSanity -test.timeout 300s > /tmp/sanity.log 2>&1 )
src=$?
grep -E "^(--- |ok|PASS|FAIL)|admin API backend|running sanity|^Ran |SUCCESS|FAIL!|\[FAIL\]" /tmp/sanity.log
[ $src -eq 0 ] || { tail -n 80 /tmp/sanity.log; fail "csi-sanity node specs"; }
if grep -q " nfs4 " /proc/mounts; then cat /proc/mounts; fail "csi-sanity left NFS mounts"; fi
step "PASS"
