#!/bin/sh
# NFS over RDMA in the guest (issue 15), soft RoCE (rdma_rxe) on eth0:
#   setup      rxe0 on eth0; chimerad (memfs) with server.rdma on the guest's
#              address, RDMA port 20049, common.rdmacm_tos 104, and
#              common.huge_pages: its RDMA buffers are registered from 2 MiB
#              hugepage slabs (chimera_rdma_registered_bytes)
#   workload   the kernel client mounts proto=rdma at vers=3 and vers=4.1 and
#              passes the dataplane guest test's whole file workload
#              (nfs-workload.sh); mountstats shows the rdma transport and 1 MiB
#              rsize/wsize; chimerad's metrics count calls, RDMA Reads (WRITE
#              payloads pulled from Read chunks) and RDMA Writes (READ data
#              pushed into Write chunks); replies invalidate the client's
#              registrations (Send With Invalidate): its local_inv_needed
#              stays under two thirds of the chunks it registered (87%
#              without)
#   diskfs     the same workload (16 MiB of data) at vers=3 and vers=4.1 on
#              a diskfs mount of the same server (a loop device): its READs,
#              WRITEs, COMMITs and metadata log flushes park
#              (chimera_rdma_calls_parked_total grows) and their replies
#              still carry READ data in Write chunks
#   engine     our fio engine (dataplane/fio) with chimera_transport=rdma:
#              the userspace client's RPC-over-RDMA (rdma::requester) to the
#              same server; 4 KiB random read/write at iodepth 16 and 1 MiB
#              sequential writes verify (crc32c); its 4 KiB WRITEs go as
#              RDMA_NOMSG with a position-zero Read chunk and its READ
#              replies come in Reply chunks (chimerad counts both); the
#              kernel client (proto=rdma) then verifies the 1 MiB file the
#              engine wrote; chimera-fuse (--transport rdma) writes 16 MiB,
#              renames, reads back cold and lists, and the kernel client
#              reads the same bytes
#   parked     an `nfs` mount (relay) of a second chimerad in the guest, at
#              vers=3 and vers=4.1: 4 MiB read back cold through it come in
#              Write chunks (at 4.1 from COMPOUNDs run on the mount's
#              workers); that remote is stopped (SIGSTOP) while a CREATE
#              (4.1: an OPEN) on the relay is in flight over RDMA: the call
#              parks, and CREATE, WRITE and READ on the memfs export over the
#              same RDMA transport answer within 5 s (the RDMA shard is not
#              held), and /metrics answers; once the remote resumes, the
#              relay's CREATE completes
#   hostile    chimera-rdma-probe (our raw verbs client) sends a wrong
#              version, a Read chunk outside its registered memory, more
#              segments than allowed, a Read chunk over the record limit, more
#              calls than its credits, garbage, and disconnects in the middle
#              of an RDMA Read, and opens more connections than the server's
#              rdma_conns_max (8): each gets RDMA_ERROR, a closed connection
#              or a refused connection, a second well-behaved client's NULL
#              succeeds after each, and chimerad's RSS grows by less than
#              64 MiB over the suite
#   shards     chimerad runs two core loops: both RDMA shards accepted
#              connections and served calls, in the core loops' threads (no
#              RDMA thread of its own)
#   pnfs       an MDS (10.0.2.15) and two data servers (10.0.2.16, .17:
#              their own processes and addresses) all with server.rdma; the
#              MDS lists the DSes with netid rdma (advertised rdma-first in
#              GETDEVICEINFO), mirrors=2: the kernel's flex-files client
#              writes and reads 32 MiB through layouts (LAYOUTGET in
#              mountstats), both DSes count the data in RDMA calls, RDMA
#              Reads and Writes, the MDS serves no READ/WRITE data; then the
#              DS that served the reads is killed (-9) and the file still
#              reads back intact, now from the other DS over RDMA; before
#              that, draining a DS at the admin API recalls the client's
#              layouts with CB_LAYOUTRECALL over its RDMA connection
#              ... and our fio engine in pNFS mode over RDMA (its NFSv4.1
#              session to the MDS with the back channel, NFSv3 to the rdma
#              netaddrs of GETDEVICEINFO) writes and verifies a file, both
#              DSes counting the RDMA calls
#   figures    NULL round trips over RDMA and TCP (chimera-rdma-probe), 4 KiB
#              QD1 reads over RDMA and over TCP against the same server, by
#              the kernel client (fio psync) and by our engine (QD1 and QD16),
#              recorded, not gated, next to ib_send_lat / ib_read_lat, the
#              transport's floor
# Results: /results/rdma-*.txt.
set -u
BIN=/results/bin
PORT=2049
MPORT=20048
RPORT=20049
MPORT_METRICS=9100
ADDR=10.0.2.15
STEP=setup
LOG=/tmp/chimerad.log
pid=""

step() { STEP=$1; echo "---- step: $STEP"; }
ok() { echo "ok   [rdma $STEP] $*"; }
fail() {
  echo "FAIL [rdma $STEP] $*"
  [ -f $LOG ] && { echo "--- chimerad log (tail)"; tail -n 30 $LOG; cp $LOG /results/rdma-chimerad.log; }
  for n in remote mds ds1 ds2; do
    [ -f /tmp/$n.log ] && { echo "--- $n log (tail)"; tail -n 15 /tmp/$n.log; cp /tmp/$n.log /results/rdma-pnfs-$n.log; }
  done
  dmesg | tail -n 20
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  exit 1
}
metric() { awk -v n="$1" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }' /tmp/metrics.txt; }
scrape() { wget -qO /tmp/metrics.txt "http://127.0.0.1:$MPORT_METRICS/metrics" || fail "cannot scrape metrics"; }

step setup
# nfs_layout_flexfiles: the kernel asks for the layout driver through a
# modprobe this initramfs cannot run at that moment; load it up front.
for m in nfs nfsv3 nfsv4 nfs_layout_flexfiles rpcrdma rdma_rxe ib_uverbs rdma_ucm fuse; do modprobe $m || fail "modprobe $m"; done
[ -c /dev/fuse ] || mknod /dev/fuse c 10 229 || fail "no /dev/fuse"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
# diskfs needs O_DIRECT: a loop device over a file in the guest's memory.
modprobe loop || fail "modprobe loop"
[ -b /dev/loop0 ] || mknod /dev/loop0 b 7 0 || fail "mknod /dev/loop0"
truncate -s 320M /tmp/dev0.img && losetup /dev/loop0 /tmp/dev0.img || fail "set up the loop device for diskfs: $(ls -l /tmp/dev0.img /dev/loop* 2>&1 | head -n 3)"
# The remote of the relay mount: a second chimerad (memfs, TCP only).
REMOTE_PORT=2050
cat >/tmp/remote.json <<JSON
{
  "common":  { "log_level": "info" },
  "server":  { "role": "both", "bind": "$ADDR", "cores": 1,
               "nfs_port": $REMOTE_PORT, "mount_port": 20050, "portmap_port": 0, "grace_time_s": 0 },
  "mounts":  { "export": { "module": "memfs", "path": "/", "capacity_bytes": 67108864 } },
  "exports": { "/export": { "path": "/export" } },
  "admin":   { "enabled": false },
  "metrics": { "enabled": false }
}
JSON
"$BIN/chimerad" --config /tmp/remote.json >/tmp/remote.log 2>&1 &
rpid=$!
# Registered memory (RDMA buffers) and diskfs's pools from 2 MiB hugepage
# slabs (64 MiB each): 96 pages leave room for a second slab.
echo 96 >/proc/sys/vm/nr_hugepages
cat >/tmp/c.json <<JSON
{
  "common":  { "log_level": "info", "rdmacm_tos": 104, "huge_pages": true },
  "server":  { "role": "both", "bind": "$ADDR", "cores": 2,
               "nfs_port": $PORT, "mount_port": $MPORT, "portmap_port": 0,
               "rdma": true, "rdma_hostname": "$ADDR", "rdma_port": $RPORT, "rdma_conns_max": 8,
               "grace_time_s": 15, "lease_time_s": 10,
               "vfs": { "diskfs": { "config": { "initialize": true, "devices": [ { "type": "io_uring", "path": "/dev/loop0" } ] } } } },
  "mounts":  { "export": { "module": "memfs", "path": "/", "capacity_bytes": 536870912 },
               "durable": { "module": "diskfs", "path": "/" },
               "relay": { "module": "nfs", "path": "$ADDR:/export", "port": $REMOTE_PORT, "timeout_ms": 15000 } },
  "exports": { "/export": { "path": "/export" }, "/durable": { "path": "/durable" }, "/relay": { "path": "/relay" } },
  "admin":   { "enabled": false },
  "metrics": { "enabled": true, "bind": "127.0.0.1", "port": $MPORT_METRICS }
}
JSON
"$BIN/chimerad" --check-config --config /tmp/c.json >/tmp/check.txt 2>&1 || fail "config refused: $(cat /tmp/check.txt)"
"$BIN/chimerad" --config /tmp/c.json >$LOG 2>&1 &
pid=$!
i=0
until grep -q '"service":"nfs-rdma"' $LOG && grep -q '"service":"mount"' $LOG; do
  kill -0 $pid 2>/dev/null || { pid=""; fail "chimerad exited at start: $(tail -n 5 $LOG)"; }
  i=$((i + 1)); [ $i -lt 600 ] || fail "chimerad did not listen within 60 s"
  sleep 0.1
done
ok "chimerad listens: $(grep '"service":"nfs-rdma"' $LOG)"

calls0=0; reads0=0; writes0=0
for v in 3 4.1; do
  step "workload-vers$v"
  NFS_VERS=$v NFS_PROTO=rdma NFS_PORT=$RPORT NFS_MOUNT_PORT=$MPORT NFS_SERVER=$ADDR NFS_EXPORT=/export \
    NFS_DATA_MIB=${NFS_DATA_MIB:-64} NFS_SECOND_CLIENT=none dash "$BIN/nfs-workload.sh" >/tmp/wl.txt 2>&1
  rc=$?
  sed 's/^/  /' /tmp/wl.txt
  [ $rc -eq 0 ] || fail "the kernel-client workload over RDMA failed at vers=$v"
  ms=/results/mountstats-vers$v.txt
  cp "$ms" "/results/rdma-mountstats-vers$v.txt" 2>/dev/null
  grep -q 'xprt:[[:space:]]*rdma' "$ms" || fail "mountstats shows no rdma transport: $(grep xprt: "$ms")"
  grep -q 'rsize=1048576' "$ms" && grep -q 'wsize=1048576' "$ms" || fail "rsize/wsize are not 1 MiB: $(grep 'opts:' "$ms" | head -n 1)"
  scrape
  calls=$(metric chimera_rdma_calls_total); reads=$(metric chimera_rdma_rdma_reads_total); writes=$(metric chimera_rdma_rdma_writes_total)
  [ "$calls" -gt "$calls0" ] || fail "chimera_rdma_calls_total did not grow ($calls0 -> $calls)"
  [ "$reads" -gt "$reads0" ] || fail "no RDMA Reads counted: WRITE payloads did not come through Read chunks ($reads0 -> $reads)"
  [ "$writes" -gt "$writes0" ] || fail "no RDMA Writes counted: READ data did not go through Write chunks ($writes0 -> $writes)"
  ok "vers=$v over RDMA: $((calls - calls0)) calls, $((reads - reads0)) RDMA Reads, $((writes - writes0)) RDMA Writes; $(grep 'xprt:' "$ms" | head -n 1 | cut -c1-60)"
  # Replies invalidate the client's registration (Send With Invalidate):
  # the client's own Local Invalidates (local_inv_needed, the 27th field of
  # the xprt line) stay few next to the chunks it registered.
  set -- $(awk '$1 == "xprt:" && $2 == "rdma" { print $13 + $14 + $15, $27; exit }' "$ms")
  chunks=${1:-0}; localinv=${2:-0}
  inv=$(metric chimera_rdma_sends_with_invalidate_total); notinv=$(metric chimera_rdma_replies_not_invalidated_total)
  [ "$inv" -gt "${inv0:-0}" ] || fail "no reply was sent with Send With Invalidate at vers=$v"
  # Without it the client invalidated locally for 87% of its chunks here.
  [ "$chunks" -gt 0 ] && [ $((localinv * 3)) -le $((chunks * 2)) ] || fail "the client still invalidated locally: local_inv_needed $localinv for $chunks chunks at vers=$v (Send With Invalidate: $inv, replies whose chunks named several handles: $notinv)"
  ok "vers=$v: $((inv - ${inv0:-0})) replies with Send With Invalidate, $((notinv - ${notinv0:-0})) whose chunks named several handles; the client invalidated locally $localinv times for $chunks chunks"
  inv0=$inv; notinv0=$notinv
  if [ "$v" = 3 ]; then
    huge=$(metric 'chimera_rdma_registered_bytes{from="hugepages"}'); mapped=$(metric 'chimera_rdma_registered_bytes{from="mapped"}')
    [ "$huge" -gt 0 ] && [ "$mapped" -eq 0 ] || fail "RDMA buffers not registered from the hugepage slabs (common.huge_pages): $huge bytes from slabs, $mapped mapped; $(grep -i 'hugepages\|ordinary pages' $LOG | head -n 2)"
    ok "RDMA buffers: $huge bytes registered from 2 MiB hugepage slabs, none mapped apart; $(grep '"msg":"hugepages"' $LOG)"
  fi
  calls0=$calls; reads0=$reads; writes0=$writes
done
for v in 3 4.1; do
  step "diskfs-vers$v"
  parked0=$(metric chimera_rdma_calls_parked_total)
  # diskfs copies (COPY) but keeps no extended attributes; 4.1 has neither.
  NFS_VERS=$v NFS_PROTO=rdma NFS_PORT=$RPORT NFS_MOUNT_PORT=$MPORT NFS_SERVER=$ADDR NFS_EXPORT=/durable \
    NFS_DATA_MIB=16 NFS_SECOND_CLIENT=none NFS42_BACKEND_OPS=copy dash "$BIN/nfs-workload.sh" >/tmp/wl.txt 2>&1
  rc=$?
  sed 's/^/  /' /tmp/wl.txt
  [ $rc -eq 0 ] || fail "the kernel-client workload over RDMA on diskfs failed at vers=$v"
  scrape
  calls=$(metric chimera_rdma_calls_total); writes=$(metric chimera_rdma_rdma_writes_total); parked=$(metric chimera_rdma_calls_parked_total)
  [ $((parked - parked0)) -ge 100 ] || fail "only $((parked - parked0)) calls parked on diskfs over RDMA at vers=$v (want >= 100: reads, writes and log flushes wait there)"
  [ "$writes" -gt "$writes0" ] || fail "no RDMA Writes on diskfs: parked READs did not reply through Write chunks ($writes0 -> $writes)"
  ok "vers=$v on diskfs over RDMA: $((calls - calls0)) calls, $((parked - parked0)) parked, $((writes - writes0)) RDMA Writes"
  calls0=$calls; writes0=$writes
done

step engine
# fio built against the engine's headers, with its own libraries (beyond glibc).
pfio() { LD_LIBRARY_PATH=$BIN/peer "$BIN/peer/fio" "$@"; }
ENG="--ioengine=external:$BIN/chimera-fio.so --chimera_export=/export"
# The JSON says no job had an error.
jobs_ok() { grep -q '"error" : 0' "$1" && ! grep -q '"error" : [1-9]' "$1"; }
scrape
c0=$(metric chimera_rdma_calls_total); rd0=$(metric chimera_rdma_rdma_reads_total); rc0=$(metric chimera_rdma_reply_chunks_total)
pfio $ENG --chimera_server=$ADDR --chimera_transport=rdma --name=eng --filename=eng.0 --rw=randrw --bs=4k --size=8m \
  --iodepth=16 --verify=crc32c --do_verify=1 --output-format=json >/tmp/eng.json 2>/tmp/eng.err \
  || fail "fio (our engine over RDMA) random read/write + verify: $(tail -n 5 /tmp/eng.err)"
jobs_ok /tmp/eng.json || fail "the engine's random read/write over RDMA reported an error: $(grep '"error"' /tmp/eng.json | head -n 3)"
pfio $ENG --chimera_server=$ADDR:$RPORT --chimera_transport=rdma --name=engseq --filename=engseq.0 --rw=write --bs=1m --size=16m \
  --iodepth=4 --verify=crc32c --do_verify=1 --output-format=json >/tmp/engseq.json 2>/tmp/engseq.err \
  || fail "fio (our engine over RDMA) 1 MiB writes + verify: $(tail -n 5 /tmp/engseq.err)"
jobs_ok /tmp/engseq.json || fail "the engine's 1 MiB writes over RDMA reported an error"
cp /tmp/eng.json /results/rdma-engine-randrw.json
scrape
c1=$(metric chimera_rdma_calls_total); rd1=$(metric chimera_rdma_rdma_reads_total); rc1=$(metric chimera_rdma_reply_chunks_total)
# 2,048 random 4 KiB I/Os (and the reads verifying them), 32 of 1 MiB.
[ $((c1 - c0)) -ge 2080 ] || fail "the engine's I/O did not come over RDMA: $((c1 - c0)) RDMA calls for 2,080 I/Os"
[ $((rd1 - rd0)) -ge 1000 ] || fail "the engine's WRITEs did not come in Read chunks: $((rd1 - rd0)) RDMA Reads"
[ $((rc1 - rc0)) -ge 1000 ] || fail "the engine's READ replies did not go through Reply chunks: $((rc1 - rc0))"
# What the engine wrote over RDMA, the kernel client reads back and verifies.
mkdir -p /mnt/k
mount -t nfs -o vers=3,proto=rdma,port=$RPORT,mountport=$MPORT,mountproto=tcp,nolock $ADDR:/export /mnt/k || fail "mount /export over RDMA for the read-back"
echo 3 >/proc/sys/vm/drop_caches
fio --name=engseq --filename=/mnt/k/engseq.0 --rw=write --bs=1m --size=16m --ioengine=psync --direct=1 \
  --verify=crc32c --verify_only >/tmp/engk.txt 2>&1 || fail "the kernel client's verify of the file the engine wrote: $(tail -n 5 /tmp/engk.txt)"
grep -q 'err= 0' /tmp/engk.txt || fail "the kernel client's verify of the engine's file reported an error: $(grep 'err=' /tmp/engk.txt)"
umount /mnt/k
ok "our engine over RDMA: randrw 4 KiB QD16 and 1 MiB writes verify; $((c1 - c0)) RDMA calls, $((rd1 - rd0)) RDMA Reads (WRITEs in Read chunks), $((rc1 - rc0)) Reply chunks (READ replies); the kernel client verifies the engine's 1 MiB file"
# chimera-fuse (the FUSE file system over the same client library) over
# RDMA: 16 MiB written and read back cold with the same checksum, a
# directory listed, a rename, the kernel client (proto=rdma) sees the same
# bytes; chimerad counts the RDMA calls.
mkdir -p /mnt/f
c0=$(metric chimera_rdma_calls_total)
"$BIN/chimera-fuse" --server $ADDR:$RPORT --transport rdma --export /export --foreground /mnt/f >/tmp/fuse.log 2>&1 &
fusepid=$!
i=0
until grep -q " /mnt/f fuse" /proc/self/mounts; do
  kill -0 $fusepid 2>/dev/null || fail "chimera-fuse over RDMA exited: $(tail -n 5 /tmp/fuse.log)"
  i=$((i + 1)); [ $i -lt 300 ] || fail "chimera-fuse over RDMA did not mount within 30 s: $(tail -n 5 /tmp/fuse.log)"
  sleep 0.1
done
dd if=/dev/urandom of=/tmp/fsrc bs=1M count=16 2>/dev/null
want=$(sha256sum </tmp/fsrc)
mkdir -p /mnt/f/fdir && cp /tmp/fsrc /mnt/f/fdir/big && sync || fail "writing 16 MiB through chimera-fuse over RDMA"
mv /mnt/f/fdir/big /mnt/f/fdir/big2 || fail "rename through chimera-fuse over RDMA"
echo 3 >/proc/sys/vm/drop_caches
[ "$(sha256sum </mnt/f/fdir/big2)" = "$want" ] || fail "16 MiB read back through chimera-fuse over RDMA differ"
[ "$(ls /mnt/f/fdir)" = big2 ] || fail "chimera-fuse over RDMA lists $(ls /mnt/f/fdir | tr '\n' ' ')"
mount -t nfs -o vers=3,proto=rdma,port=$RPORT,mountport=$MPORT,mountproto=tcp,nolock $ADDR:/export /mnt/k || fail "mount /export over RDMA beside chimera-fuse"
[ "$(sha256sum </mnt/k/fdir/big2)" = "$want" ] || fail "the kernel client reads other bytes than chimera-fuse wrote"
umount /mnt/k
umount /mnt/f || fail "unmount chimera-fuse"
i=0
while kill -0 $fusepid 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 100 ] || { kill -9 $fusepid; fail "chimera-fuse did not exit within 10 s of its unmount"; }
  sleep 0.1
done
scrape
c1=$(metric chimera_rdma_calls_total)
[ $((c1 - c0)) -ge 32 ] || fail "chimera-fuse's I/O did not come over RDMA: $((c1 - c0)) RDMA calls"
ok "chimera-fuse over RDMA: 16 MiB written, renamed, read back cold (sha256 equal), listed; the kernel client reads the same bytes; $((c1 - c0)) RDMA calls"

step parked
i=0
until grep -q '"msg":"started"' /tmp/remote.log; do
  kill -0 $rpid 2>/dev/null || fail "the relay's remote exited: $(tail -n 5 /tmp/remote.log)"
  i=$((i + 1)); [ $i -lt 300 ] || fail "the relay's remote did not start within 30 s"
  sleep 0.1
done
mkdir -p /mnt/x /mnt/relay
for v in 3 4.1; do
  case $v in
    3) opts="vers=3,proto=rdma,port=$RPORT,mountport=$MPORT,mountproto=tcp,nolock" ;;
    *) opts="vers=$v,proto=rdma,port=$RPORT" ;;
  esac
  mount -t nfs -o "$opts" $ADDR:/export /mnt/x || fail "mount /export over RDMA at vers=$v"
  mount -t nfs -o "$opts" $ADDR:/relay /mnt/relay || fail "mount /relay over RDMA at vers=$v"
  echo warm >/mnt/relay/warm && [ "$(cat /mnt/relay/warm)" = warm ] || fail "the relay mount does not work before the stall at vers=$v"
  grep -q 'xprt:[[:space:]]*rdma' /proc/self/mountstats || fail "the mounts are not on rdma"
  # 4 MiB through the relay and read back cold: 1 MiB READs whose data
  # leaves through Write chunks (at 4.1 they run on the mount's workers,
  # and the core places their data from the worker's reply).
  dd if=/dev/urandom of=/tmp/big bs=1M count=4 2>/dev/null
  cp /tmp/big /mnt/relay/big-$v || fail "writing 4 MiB through the relay at vers=$v"
  # A write delegation (4.1) keeps the pages dirty past close: sync first.
  sync
  scrape; writes0=$(metric chimera_rdma_rdma_writes_total)
  echo 3 >/proc/sys/vm/drop_caches
  [ "$(sha256sum </mnt/relay/big-$v)" = "$(sha256sum </tmp/big)" ] || fail "4 MiB read back through the relay differ at vers=$v"
  scrape; writes=$(metric chimera_rdma_rdma_writes_total)
  [ $((writes - writes0)) -ge 4 ] || fail "the relay's 1 MiB READs did not reply through Write chunks at vers=$v ($writes0 -> $writes RDMA Writes)"
  # The remote stops answering: SIGSTOP (its socket still takes the call).
  parked0=$(metric chimera_rdma_calls_parked_total)
  kill -STOP $rpid
  touch /mnt/relay/during-$v 2>/tmp/touch.err &
  tpid=$!
  sleep 2
  kill -0 $tpid 2>/dev/null || { kill -CONT $rpid; fail "the relay's CREATE ended while its remote was stopped at vers=$v: $(cat /tmp/touch.err)"; }
  t1=$(date +%s)
  ( echo during >/mnt/x/during-$v && cat /mnt/x/during-$v >/dev/null && ls /mnt/x >/dev/null ) &
  xpid=$!
  i=0
  while kill -0 $xpid 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 50 ] || { kill -CONT $rpid; fail "a memfs CREATE/WRITE/READ over RDMA waited more than 5 s while a relay call was stalled at vers=$v: the RDMA shard was held"; }
    sleep 0.1
  done
  wait $xpid || { kill -CONT $rpid; fail "the memfs calls over RDMA failed while the relay was stalled at vers=$v"; }
  took=$(( $(date +%s) - t1 ))
  kill -0 $tpid 2>/dev/null || { kill -CONT $rpid; fail "the relay's CREATE ended while its remote was stopped at vers=$v: $(cat /tmp/touch.err)"; }
  scrape
  parked=$(metric chimera_rdma_calls_parked_total)
  [ "$parked" -gt "$parked0" ] || { kill -CONT $rpid; fail "the stalled relay call did not park at vers=$v ($parked0 -> $parked)"; }
  kill -CONT $rpid
  t2=$(date +%s)
  # Resumed, the remote answers and the CREATE completes (the scrapes above
  # answered from the mount's last space figures: they never wait on it).
  i=0
  while kill -0 $tpid 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 300 ] || fail "the relay's CREATE still hangs 30 s after its remote resumed at vers=$v (timeout_ms is 15 s)"
    sleep 0.1
  done
  wait $tpid || fail "the relay's CREATE failed after its remote resumed at vers=$v: $(cat /tmp/touch.err); $(grep 'remote export lost' $LOG | tail -n 1)"
  [ -e /mnt/relay/during-$v ] || fail "the relay's file is missing after its CREATE succeeded at vers=$v"
  relay="completed $(( $(date +%s) - t2 )) s after the remote resumed"
  umount /mnt/relay || umount -f /mnt/relay; umount /mnt/x
  ok "vers=$v: a relay CREATE parked over RDMA while its remote was stopped; memfs CREATE/WRITE/READ on the same transport answered meanwhile (${took} s); the relay's CREATE $relay; 4 MiB read back through the relay in $((writes - writes0)) RDMA Writes"
done
grep '^chimera_rdma' /tmp/metrics.txt >/results/rdma-metrics.txt

step hostile
rss() { awk '/^VmRSS:/ { print $2 }' /proc/$pid/status; }
rss0=$(rss)
"$BIN/chimera-rdma-probe" hostile $ADDR:$RPORT --conns-max 8 >/results/rdma-hostile.txt 2>&1
rc=$?
sed 's/^/  /' /results/rdma-hostile.txt
[ $rc -eq 0 ] || fail "the hostile-input suite failed (rc $rc)"
kill -0 $pid 2>/dev/null || fail "chimerad died during the hostile-input suite"
rss1=$(rss)
[ $((rss1 - rss0)) -lt 65536 ] || fail "chimerad's RSS grew from $rss0 KiB to $rss1 KiB over the hostile suite"
scrape
ok "every hostile message refused or closed; RSS $rss0 -> $rss1 KiB; $(metric chimera_rdma_errors_sent_total) RDMA_ERRORs sent, $(metric chimera_rdma_protocol_errors_total) connections closed for protocol errors, $(metric chimera_rdma_connections_open) open"
[ "$(metric chimera_rdma_errors_sent_total)" -ge 3 ] || fail "fewer than 3 RDMA_ERRORs counted"

step shards
# Two core loops, two RDMA shards: the kernel mounts of the steps above and
# the probe's connections were spread over both, and each shard served
# calls in its own core loop (no RDMA thread of its own).
shard() { awk -v n="$1{core=\"$2\"}" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }' /tmp/metrics.txt; }
grep '^chimera_rdma_shard' /tmp/metrics.txt | sed 's/^/  /'
for c in 0 1; do
  [ "$(shard chimera_rdma_shard_connections_accepted_total $c)" -ge 1 ] || fail "shard $c accepted no RDMA connection"
  [ "$(shard chimera_rdma_shard_calls_total $c)" -ge 100 ] || fail "shard $c served fewer than 100 RDMA calls"
done
[ "$(shard chimera_rdma_shard_calls_total 2)" = 0 ] || fail "a third shard with two cores"
threads=$(ls /proc/$pid/task | while read t; do cat /proc/$pid/task/$t/comm; done | sort | uniq -c | tr -s ' ' | tr '\n' ';')
case "$threads" in *chimera-rdma*) fail "an RDMA thread of its own runs beside the core loops: $threads" ;; esac
case "$threads" in *"2 chimera-core-"*|*"chimera-core-0"*"chimera-core-1"*) ;; *) fail "expected two core loops: $threads" ;; esac
ok "connections accepted per shard: $(shard chimera_rdma_shard_connections_accepted_total 0) / $(shard chimera_rdma_shard_connections_accepted_total 1), calls $(shard chimera_rdma_shard_calls_total 0) / $(shard chimera_rdma_shard_calls_total 1); threads: $threads"

step figures
"$BIN/chimera-rdma-probe" null $ADDR:$RPORT --count 2000 --tcp $ADDR:$PORT >/tmp/null.txt 2>&1 || fail "NULL round trips: $(cat /tmp/null.txt)"
# 4 KiB O_DIRECT random reads at QD1 from one file, over RDMA and over TCP
# (fio, psync); the p50 completion latency of each, side by side.
mkdir -p /mnt/r /mnt/t
mount -t nfs -o vers=4.1,proto=rdma,port=$RPORT $ADDR:/export /mnt/r || fail "mount rdma"
mount -t nfs -o vers=4.1,proto=tcp,port=$PORT $ADDR:/export /mnt/t || fail "mount tcp"
dd if=/dev/urandom of=/mnt/r/lat bs=1M count=8 2>/dev/null && sync || fail "write the latency file"
cp /tmp/null.txt /results/rdma-figures.txt
p50() { grep -o '"50.000000" : [0-9]*' "$1" | head -n 1 | awk '{ printf "%.1f", $3 / 1000 }'; }
mean() { tr -d '\n ' <"$1" | grep -o '"clat_ns":{"min":[0-9]*,"max":[0-9]*,"mean":[0-9.]*' | head -n 1 | sed 's/.*"mean"://' | awk '{ printf "%.1f", $1 / 1000 }'; }
for p in r t; do
  name=rdma; [ $p = t ] && name=tcp
  fio --name=qd1 --filename=/mnt/$p/lat --rw=randread --bs=4k --direct=1 --ioengine=psync --iodepth=1 \
    --size=8m --time_based --runtime=5 --output-format=json >/tmp/fio-$name.json 2>/tmp/fio-$name.err \
    || fail "fio over $name: $(tail -n 3 /tmp/fio-$name.err)"
  cp /tmp/fio-$name.json /results/rdma-fio-$name.json
  iops=$(grep -o '"iops" : [0-9.]*' /tmp/fio-$name.json | head -n 1 | awk '{ printf "%d", $3 }')
  eval "k_${name}_1=$iops"
  echo "nfs4.1 4KiB QD1 randread over $name: p50 $(p50 /tmp/fio-$name.json) us (fio's bucket), mean $(mean /tmp/fio-$name.json) us, $iops IOPS" | tee -a /results/rdma-figures.txt
  # The kernel client at the engine's QD16 (libaio, O_DIRECT).
  fio --name=qd16 --filename=/mnt/$p/lat --rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
    --size=8m --time_based --runtime=5 --output-format=json >/tmp/fio-$name-16.json 2>/tmp/fio-$name.err \
    || fail "fio (libaio QD16) over $name: $(tail -n 3 /tmp/fio-$name.err)"
  cp /tmp/fio-$name-16.json /results/rdma-fio-$name-qd16.json
  iops=$(grep -o '"iops" : [0-9.]*' /tmp/fio-$name-16.json | head -n 1 | awk '{ printf "%d", $3 }')
  eval "k_${name}_16=$iops"
  echo "nfs4.1 4KiB QD16 randread over $name (libaio): p50 $(p50 /tmp/fio-$name-16.json) us (fio's bucket), $iops IOPS" | tee -a /results/rdma-figures.txt
done
umount /mnt/r; umount /mnt/t
# Our engine on the same file, over RDMA and over TCP, QD1 and QD16.
for p in rdma tcp; do
  for qd in 1 16; do
    pfio $ENG --chimera_server=$ADDR --chimera_transport=$p --name=qd$qd --filename=lat --rw=randread --bs=4k --iodepth=$qd \
      --size=8m --time_based --runtime=5 --output-format=json >/tmp/fio-eng-$p-$qd.json 2>/tmp/fio-eng.err \
      || fail "fio (our engine) over $p at QD$qd: $(tail -n 3 /tmp/fio-eng.err)"
    cp /tmp/fio-eng-$p-$qd.json /results/rdma-fio-engine-$p-qd$qd.json
    iops=$(grep -o '"iops" : [0-9.]*' /tmp/fio-eng-$p-$qd.json | head -n 1 | awk '{ printf "%d", $3 }')
    eval "e_${p}_${qd}=$iops"
    echo "engine nfs3 4KiB QD$qd randread over $p: p50 $(p50 /tmp/fio-eng-$p-$qd.json) us (fio's bucket), mean $(mean /tmp/fio-eng-$p-$qd.json) us, $iops IOPS" | tee -a /results/rdma-figures.txt
  done
done
# The engine against the kernel client on the same server and file.
for p in rdma tcp; do
  for qd in 1 16; do
    eval "e=\$e_${p}_${qd} k=\$k_${p}_${qd}"
    echo "engine / kernel client, 4KiB QD$qd randread over $p: $e / $k IOPS = $(awk -v e="$e" -v k="$k" 'BEGIN { if (k > 0) printf "%.2fx", e / k; else print "n/a" }')" | tee -a /results/rdma-figures.txt
  done
done
for t in ib_send_lat ib_read_lat; do
  $t -d rxe0 -n 500 >/dev/null 2>&1 &
  spid=$!
  sleep 1
  $t -d rxe0 -n 500 $ADDR 2>/tmp/$t.err | awk -v t=$t '$1 ~ /^[0-9]+$/ && NF >= 5 { print t " " $1 " B: t_typical " $5 " us" }' | tee -a /results/rdma-figures.txt
  wait $spid
done
grep -q 'over rdma' /results/rdma-figures.txt || fail "no RDMA figure recorded"

kill $pid $rpid; wait $pid $rpid 2>/dev/null; pid=""
cp $LOG /results/rdma-chimerad.log

step pnfs
ip addr add 10.0.2.16/24 dev eth0 && ip addr add 10.0.2.17/24 dev eth0 || fail "add the DS addresses"
sleep 1
start_server() {  # $1: name, $2: config; prints the pid
  "$BIN/chimerad" --check-config --config "$2" >/tmp/$1.check 2>&1 || fail "$1 config refused: $(cat /tmp/$1.check)"
  "$BIN/chimerad" --config "$2" >/tmp/$1.log 2>&1 &
  echo $!
}
wait_rdma() {  # $1: name, $2: pid
  i=0
  until grep -q '"service":"nfs-rdma"' /tmp/$1.log && grep -q '"msg":"started"' /tmp/$1.log; do
    kill -0 $2 2>/dev/null || fail "$1 exited at start: $(tail -n 5 /tmp/$1.log)"
    i=$((i + 1)); [ $i -lt 600 ] || fail "$1 did not start within 60 s"
    sleep 0.1
  done
}
n=1
for a in 10.0.2.16 10.0.2.17; do
  cat >/tmp/ds$n.json <<JSON
{
  "common":  { "log_level": "info", "rdmacm_tos": 104 },
  "server":  { "role": "ds", "bind": "$a", "cores": 1, "nfs_port": $PORT, "mount_port": 0, "portmap_port": 0,
               "rdma": true, "rdma_hostname": "$a", "rdma_port": $RPORT },
  "mounts":  { "ds": { "module": "memfs", "path": "/", "capacity_bytes": 268435456 } },
  "metrics": { "bind": "127.0.0.1", "port": $((MPORT_METRICS + n)) }
}
JSON
  n=$((n + 1))
done
cat >/tmp/mds.json <<JSON
{
  "common":  { "log_level": "info" },
  "server":  { "role": "mds", "bind": "$ADDR", "cores": 1, "nfs_port": $PORT, "mount_port": 0, "portmap_port": 0,
               "rdma": true, "rdma_hostname": "$ADDR", "rdma_port": $RPORT, "grace_time_s": 0,
               "pnfs": { "enabled": true, "stripe_unit_bytes": 1048576, "mirrors": 2,
                         "data_servers": [ { "netid": "rdma", "uaddr": "10.0.2.16:$RPORT" },
                                           { "netid": "rdma", "uaddr": "10.0.2.17:$RPORT" } ] } },
  "mounts":  { "export": { "module": "memfs", "path": "/", "capacity_bytes": 268435456 } },
  "exports": { "/export": { "path": "/export" } },
  "admin":   { "bind": "$ADDR", "port": 8080, "token": "rdma-test-token", "tls": false },
  "metrics": { "enabled": true, "bind": "127.0.0.1", "port": $MPORT_METRICS }
}
JSON
ds1=$(start_server ds1 /tmp/ds1.json); ds2=$(start_server ds2 /tmp/ds2.json)
wait_rdma ds1 $ds1; wait_rdma ds2 $ds2
mds=$(start_server mds /tmp/mds.json); wait_rdma mds $mds
pid=$mds
mkdir -p /mnt/p
mount -t nfs -o vers=4.1,proto=rdma,port=$RPORT,soft,timeo=50,retrans=2 $ADDR:/export /mnt/p || fail "mount the MDS over RDMA"
dd if=/dev/urandom of=/tmp/src bs=1M count=32 2>/dev/null || fail "make the source"
want=$(sha256sum /tmp/src | cut -d' ' -f1)
dd if=/tmp/src of=/mnt/p/mirrored bs=1M conv=fsync 2>/dev/null || fail "write through the layout"
sync; echo 3 >/proc/sys/vm/drop_caches
got=$(sha256sum /mnt/p/mirrored | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "read back $got, want $want"
cp /proc/self/mountstats /results/rdma-pnfs-mountstats.txt
# The layout may arrive inside OPEN (then LAYOUTGET stays 0); the pNFS
# read/write events (the last two "events:" counters on Linux 6.1) and
# GETDEVICEINFO say the client did I/O through layouts.
ours() { awk '/^device / { m = ($5 == "/mnt/p") } m' /proc/self/mountstats; }
ev=$(ours | awk '$1 == "events:" { print $(NF - 1), $NF; exit }')
gdi=$(ours | awk '$1 == "GETDEVICEINFO:" { print $2; exit }')
set -- $ev
[ "${1:-0}" -gt 0 ] && [ "${2:-0}" -gt 0 ] && [ "${gdi:-0}" -gt 0 ] \
  || fail "the client did no pNFS I/O (pnfs_read ${1:-?}, pnfs_write ${2:-?}, GETDEVICEINFO ${gdi:-?})"
lg="pnfs_read $1, pnfs_write $2, GETDEVICEINFO $gdi"
ours | grep -q 'xprt:[[:space:]]*rdma' || fail "the MDS mount is not on rdma"
for n in 1 2; do
  wget -qO /tmp/metrics.txt "http://127.0.0.1:$((MPORT_METRICS + n))/metrics" || fail "scrape ds$n"
  cp /tmp/metrics.txt /results/rdma-pnfs-ds$n-metrics.txt
  c=$(metric chimera_rdma_calls_total); r=$(metric chimera_rdma_rdma_read_bytes_total); w=$(metric chimera_rdma_rdma_write_bytes_total)
  [ "$r" -ge $((30 << 20)) ] || fail "ds$n pulled only $r bytes with RDMA Read (the mirrored 32 MiB should all come over RDMA)"
  ok "ds$n over RDMA: $c calls, $r bytes by RDMA Read, $w bytes by RDMA Write"
  eval "served$n=$w"
done
wget -qO /tmp/metrics.txt "http://127.0.0.1:$MPORT_METRICS/metrics" || fail "scrape the MDS"
cp /tmp/metrics.txt /results/rdma-pnfs-mds-metrics.txt
mr=$(metric chimera_rdma_rdma_read_bytes_total)
[ "$mr" -lt $((4 << 20)) ] || fail "the MDS pulled $mr bytes: data went through the MDS, not the layout"
ok "32 MiB mirrored over two RDMA data servers ($lg), MDS RDMA Read bytes $mr"
# Our engine in pNFS mode over RDMA: the MDS session (with its back
# channel) and the data servers, all over RDMA.
ds_calls() { wget -qO /tmp/metrics.txt "http://127.0.0.1:$((MPORT_METRICS + $1))/metrics" || fail "scrape ds$1"; metric chimera_rdma_calls_total; }
d1=$(ds_calls 1); d2=$(ds_calls 2)
pfio $ENG --chimera_server=$ADDR --chimera_transport=rdma --chimera_pnfs=1 --name=engp --filename=engp.0 --rw=randrw --bs=4k \
  --size=4m --iodepth=8 --verify=crc32c --do_verify=1 --output-format=json >/tmp/engp.json 2>/tmp/engp.err \
  || fail "fio (our engine, pNFS over RDMA) random read/write + verify: $(tail -n 5 /tmp/engp.err)"
jobs_ok /tmp/engp.json || fail "the engine's pNFS I/O over RDMA reported an error"
e1=$(ds_calls 1); e2=$(ds_calls 2)
# mirrors=2: every write reaches both; 1,024 4 KiB I/Os plus the verify.
[ $((e1 - d1)) -ge 500 ] && [ $((e2 - d2)) -ge 500 ] || fail "the engine's pNFS I/O did not reach both data servers over RDMA: ds1 $((e1 - d1)), ds2 $((e2 - d2)) RDMA calls"
ok "our engine, pNFS over RDMA (MDS session and data servers): randrw 4 KiB verifies; RDMA calls on ds1 $((e1 - d1)), ds2 $((e2 - d2))"
# Drain ds2 at the MDS (as the operator does before restarting it) while
# the client holds the file open: the MDS recalls the layouts naming ds2
# with CB_LAYOUTRECALL on the client's own RDMA connection (RFC 8167), and
# the client returns them.
exec 3</mnt/p/mirrored
dd if=/mnt/p/mirrored of=/dev/null bs=1M count=2 2>/dev/null
put_ds() {  # $1: draining flag of ds2
  body='{"dataServers": [{"name": "config-0", "address": "10.0.2.16:'$RPORT'", "transport": "rdma"},
    {"name": "config-1", "address": "10.0.2.17:'$RPORT'", "transport": "rdma", "draining": '$1'}]}'
  # busybox nc half-closes at the end of its input, and the admin server
  # drops a half-closed request: keep the input open until the answer is in.
  { printf 'PUT /api/v1/dataservers HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer rdma-test-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$ADDR" "${#body}" "$body"; sleep 3; } | nc -w 10 $ADDR 8080 >/tmp/put.txt 2>&1
  head -n 1 /tmp/put.txt | grep -q ' 200' || fail "PUT /api/v1/dataservers (ds2 draining $1): $(head -c 300 /tmp/put.txt)"
}
put_ds true
i=0
while :; do
  wget -qO /tmp/metrics.txt "http://127.0.0.1:$MPORT_METRICS/metrics" || fail "scrape the MDS"
  rec=$(metric chimera_pnfs_layouts_recalled_total); ret=$(metric chimera_pnfs_layouts_returned_total); bc=$(metric chimera_rdma_backchannel_calls_total)
  [ "$rec" -ge 1 ] && [ "$ret" -ge 1 ] && [ "$bc" -ge 1 ] && break
  i=$((i + 1)); [ $i -lt 60 ] || fail "no recall over RDMA within 30 s (recalled $rec, returned $ret, back-channel calls $bc)"
  sleep 0.5
done
exec 3<&-
ok "ds2 drained: $rec layouts recalled with $bc back-channel calls over RDMA, $ret returned by the client"
put_ds false

# Kill the data server the reads came from: the client must turn to the
# other mirror (and read it there over RDMA).
if [ "$served1" -ge "$served2" ]; then victim=1; vpid=$ds1; other=2; else victim=2; vpid=$ds2; other=1; fi
kill -9 $vpid; wait $vpid 2>/dev/null
sync; echo 3 >/proc/sys/vm/drop_caches
got=$(sha256sum /mnt/p/mirrored | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "after ds$victim was killed the mirrored file reads $got, want $want"
wget -qO /tmp/metrics.txt "http://127.0.0.1:$((MPORT_METRICS + other))/metrics" || fail "scrape ds$other"
eval "before=\$served$other"
after=$(metric chimera_rdma_rdma_write_bytes_total)
[ $((after - before)) -ge $((30 << 20)) ] || fail "ds$other sent only $((after - before)) bytes by RDMA Write after ds$victim died"
ok "ds$victim (which served the reads) killed (-9): the mirrored file reads back intact, ds$other sent $((after - before)) bytes by RDMA Write"
umount /mnt/p || umount -f /mnt/p
kill $mds $ds1 $ds2 2>/dev/null; wait $mds $ds1 $ds2 2>/dev/null; pid=""
for n in mds ds1 ds2; do cp /tmp/$n.log /results/rdma-pnfs-$n.log; done
echo "PASS rdma"
