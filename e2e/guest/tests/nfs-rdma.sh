#!/bin/sh
# NFS over RDMA in the guest (issue 15), soft RoCE (rdma_rxe) on eth0:
#   setup      rxe0 on eth0; chimerad (memfs) with server.rdma on the guest's
#              address, RDMA port 20049, common.rdmacm_tos 104
#   workload   the kernel client mounts proto=rdma at vers=3 and vers=4.1 and
#              passes the dataplane guest test's whole file workload
#              (nfs-workload.sh); mountstats shows the rdma transport and 1 MiB
#              rsize/wsize; chimerad's metrics count calls, RDMA Reads (WRITE
#              payloads pulled from Read chunks) and RDMA Writes (READ data
#              pushed into Write chunks)
#   hostile    chimera-rdma-probe (our raw verbs client) sends a wrong
#              version, a Read chunk outside its registered memory, more
#              segments than allowed, a Read chunk over the record limit, more
#              calls than its credits, garbage, and disconnects in the middle
#              of an RDMA Read: each gets RDMA_ERROR or a closed connection, a
#              second well-behaved client's NULL succeeds after each, and
#              chimerad's RSS grows by less than 64 MiB over the suite
#   figures    NULL round trips over RDMA and TCP (chimera-rdma-probe), 4 KiB
#              QD1 reads over RDMA and over TCP against the same server (fio),
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
  dmesg | tail -n 20
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  exit 1
}
metric() { awk -v n="$1" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }' /tmp/metrics.txt; }
scrape() { wget -qO /tmp/metrics.txt "http://127.0.0.1:$MPORT_METRICS/metrics" || fail "cannot scrape metrics"; }

step setup
for m in nfs nfsv3 nfsv4 rpcrdma rdma_rxe ib_uverbs rdma_ucm; do modprobe $m || fail "modprobe $m"; done
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
cat >/tmp/c.json <<JSON
{
  "common":  { "log_level": "info", "rdmacm_tos": 104 },
  "server":  { "role": "both", "bind": "$ADDR", "cores": 1,
               "nfs_port": $PORT, "mount_port": $MPORT, "portmap_port": 0,
               "rdma": true, "rdma_hostname": "$ADDR", "rdma_port": $RPORT,
               "grace_time_s": 15, "lease_time_s": 10 },
  "mounts":  { "export": { "module": "memfs", "path": "/", "capacity_bytes": 536870912 } },
  "exports": { "/export": { "path": "/export" } },
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
  calls0=$calls; reads0=$reads; writes0=$writes
done
grep '^chimera_rdma' /tmp/metrics.txt >/results/rdma-metrics.txt

step hostile
rss() { awk '/^VmRSS:/ { print $2 }' /proc/$pid/status; }
rss0=$(rss)
"$BIN/chimera-rdma-probe" hostile $ADDR:$RPORT >/results/rdma-hostile.txt 2>&1
rc=$?
sed 's/^/  /' /results/rdma-hostile.txt
[ $rc -eq 0 ] || fail "the hostile-input suite failed (rc $rc)"
kill -0 $pid 2>/dev/null || fail "chimerad died during the hostile-input suite"
rss1=$(rss)
[ $((rss1 - rss0)) -lt 65536 ] || fail "chimerad's RSS grew from $rss0 KiB to $rss1 KiB over the hostile suite"
scrape
ok "every hostile message refused or closed; RSS $rss0 -> $rss1 KiB; $(metric chimera_rdma_errors_sent_total) RDMA_ERRORs sent, $(metric chimera_rdma_protocol_errors_total) connections closed for protocol errors, $(metric chimera_rdma_connections_open) open"
[ "$(metric chimera_rdma_errors_sent_total)" -ge 3 ] || fail "fewer than 3 RDMA_ERRORs counted"

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
  echo "nfs4.1 4KiB QD1 randread over $name: p50 $(p50 /tmp/fio-$name.json) us (fio's bucket), mean $(mean /tmp/fio-$name.json) us, $iops IOPS" | tee -a /results/rdma-figures.txt
done
umount /mnt/r; umount /mnt/t
for t in ib_send_lat ib_read_lat; do
  $t -d rxe0 -n 500 >/dev/null 2>&1 &
  spid=$!
  sleep 1
  $t -d rxe0 -n 500 $ADDR 2>/tmp/$t.err | awk -v t=$t '$1 ~ /^[0-9]+$/ && NF >= 5 { print t " " $1 " B: t_typical " $5 " us" }' | tee -a /results/rdma-figures.txt
  wait $spid
done
grep -q 'over rdma' /results/rdma-figures.txt || fail "no RDMA figure recorded"

kill $pid; wait $pid 2>/dev/null; pid=""
cp $LOG /results/rdma-chimerad.log
echo "PASS rdma"
