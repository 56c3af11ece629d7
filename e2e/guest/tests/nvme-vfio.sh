#!/bin/sh
# The userspace NVMe driver on QEMU's emulated NVMe controllers behind the
# emulated IOMMU (runs inside the guest; the host side is test-vfio.sh).
#
# The guest has four controllers, in PCI order: A (serial chimA) and B
# (serial chimB) with NVME_BYTES each, C (chimC, 8 MiB) for the crash
# states, and E (serial chimE) with no namespace. Binaries and the kernel-client workload come over the results
# share in /results/bin. Steps, each asserted:
#   refusals   every start-up error the driver can meet here, each naming the
#              address: not present, not NVMe, unbound, bound to nvme, no
#              namespace, in use by another process
#   identify   serial, size and LBA format are what QEMU was given
#   exercise   10,000 random reads and writes with verification on 2 queue
#              pairs, flush, write-zeroes, an out-of-range read refused by
#              the controller (A, SGL data pointers); a shorter run on B with
#              PRP lists
#   crash-vfio diskfs's crash-state suite (every flush-point image, CRASH_SEEDS
#              random ones each; default 0) written to C and recovered through
#              the driver; crash-uring (at the end) the same through io_uring
#   bench      4 KiB random reads, QD1 and QD32, through vfio, polled; QD1
#              also through the blocking wait (interrupts) (recorded)
#   diskfs     chimerad on diskfs over the two vfio devices, its DMA memory
#              (buffer pools, queues) carved from one 1 GiB hugepage slab
#              (common.huge_pages, huge_page_size 1G); the kernel
#              client workload at vers=3 and vers=4.1 (checksums); both
#              devices carry data (per-device metrics)
#   interrupts the controllers' MSI-X vectors (one per I/O queue pair, through
#              VFIO eventfds the cores sleep on) fired during the workload
#   restart    kill -9 chimerad while a client writes with fsync, restart on
#              the same devices; the writer sees no error and the file reads
#              back with the source's checksum
#   fsck-vfio  chimera-fsck reads both devices through the driver: clean
#   uring      A given back to the kernel nvme driver: the same benchmark
#              through io_uring on /dev/nvmeXn1 (recorded side by side)
# Results: /results/vfio-*.txt; the device images are checked by the host
# (chimera-fsck over io_uring) after the guest powers off.
set -u
BIN=/results/bin
: "${NVME_BYTES:?}"
OPS=${NVME_OPS:-10000}
PORT=2049
MPORT=20048
MPORT_METRICS=9100
STEP=setup
LOG=/tmp/chimerad.log
pid=""

step() { STEP=$1; echo "---- step: $STEP"; }
ok() { echo "ok   [vfio $STEP] $*"; }
fail() {
  echo "FAIL [vfio $STEP] $*"
  [ -f $LOG ] && { echo "--- chimerad log (tail)"; tail -n 30 $LOG; cp $LOG /results/vfio-chimerad.log; }
  dmesg | tail -n 20
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  exit 1
}

step setup
for m in vfio_pci vfio_iommu_type1 nfs nfsv3 nfsv4; do modprobe $m || fail "modprobe $m"; done
ctrls=""; netdev=""
for d in /sys/bus/pci/devices/*; do
  case "$(cat "$d/class")" in
    0x010802) ctrls="$ctrls $(basename "$d")" ;;
    0x020000) [ -z "$netdev" ] && netdev=$(basename "$d") ;;
  esac
done
# shellcheck disable=SC2086
set -- $ctrls
[ $# -eq 4 ] || fail "expected 4 NVMe controllers, found:$ctrls"
A=$1; B=$2; C=$3; E=$4
ok "controllers A=$A B=$B C(8 MiB)=$C E(no namespace)=$E, a non-NVMe device $netdev"
echo 64 >/proc/sys/vm/nr_hugepages
ok "hugepages: $(grep HugePages_Total /proc/meminfo)"

check() { "$BIN/chimera-nvme-check" "$@"; }
refused() {
  addr=$1; shift
  out=$(check open "$addr" 2>&1) && fail "open $addr succeeded: $out"
  for w in "$@"; do
    echo "$out" | grep -qF -- "$w" || fail "the refusal of $addr lacks '$w': $out"
  done
  echo "$out" | grep -qF -- "$addr" || fail "the refusal does not name $addr: $out"
  ok "$out"
}
bind_vfio() {
  d=/sys/bus/pci/devices/$1
  [ -e "$d/driver" ] && { echo "$1" >"$d/driver/unbind" || fail "unbind $1"; }
  echo vfio-pci >"$d/driver_override" || fail "driver_override $1"
  echo "$1" >/sys/bus/pci/drivers_probe || fail "probe $1"
  [ "$(basename "$(readlink "$d/driver")")" = vfio-pci ] || fail "$1 is not bound to vfio-pci"
}
bind_nvme() {
  d=/sys/bus/pci/devices/$1
  [ -e "$d/driver" ] && { echo "$1" >"$d/driver/unbind" || fail "unbind $1"; }
  echo >"$d/driver_override"
  echo "$1" >/sys/bus/pci/drivers_probe || fail "probe $1"
}
# Give controller $1 back to the kernel's nvme driver; KDEV is its first
# namespace's block device (made here: no udev in the guest).
kernel_blockdev() {
  bind_nvme "$1"
  # The block device's own entry (nvmeXnY with its dev file): the generic
  # character device ngXnY can appear first, and matching any "n1" once
  # raced the block device (a CI run found no nvme*n1 to mknod).
  ns=""; i=0
  while :; do
    for n in /sys/bus/pci/devices/$1/nvme/nvme*/nvme*n1; do [ -r "$n/dev" ] && { ns=$n; break; }; done
    [ -n "$ns" ] && break
    i=$((i + 1)); [ $i -lt 100 ] || fail "no namespace block device for $1 after 10 s"
    sleep 0.1
  done
  KDEV=/dev/$(basename "$ns")
  [ -b "$KDEV" ] || mknod "$KDEV" b "$(cut -d: -f1 "$ns/dev")" "$(cut -d: -f2 "$ns/dev")"
}

step refusals
refused 0000:00:1e.7 "no such PCI device"
refused "$netdev" "is not an NVMe controller"
if [ -e "/sys/bus/pci/devices/$A/driver" ]; then
  ok "(A is already bound at boot: the unbound case is shown below on E)"
else
  refused "$A" "is not bound to any driver" "vfio-pci"
fi
modprobe nvme || fail "modprobe nvme"
i=0; until [ -e "/sys/bus/pci/devices/$A/driver" ]; do i=$((i + 1)); [ $i -lt 100 ] || fail "nvme did not bind $A"; sleep 0.1; done
refused "$A" "is bound to the nvme driver, not vfio-pci" "driver_override"
for c in $A $B $C $E; do bind_vfio "$c"; done
ok "A, B, C and E bound to vfio-pci (groups $(basename "$(readlink /sys/bus/pci/devices/$A/iommu_group)"), $(basename "$(readlink /sys/bus/pci/devices/$B/iommu_group)"))"
refused "$E" "no active namespace"
check identify "$A" --hold 6 >/tmp/hold.out 2>&1 &
holder=$!
i=0; until grep -q '^serial=' /tmp/hold.out 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 600 ] || fail "the holder never opened A: $(cat /tmp/hold.out)"; sleep 0.1
done
refused "$A" "in use by another process"
wait $holder || fail "the holder failed: $(cat /tmp/hold.out)"

step identify
check identify "$A" >/tmp/id.txt 2>&1 || fail "identify: $(cat /tmp/id.txt)"
cp /tmp/id.txt /results/vfio-identify.txt
grep -qx "serial=chimA" /tmp/id.txt || fail "serial: $(grep serial /tmp/id.txt), want chimA"
grep -qx "bytes=$NVME_BYTES" /tmp/id.txt || fail "size: $(grep bytes= /tmp/id.txt), want $NVME_BYTES"
grep -qx "lba_bytes=512" /tmp/id.txt || fail "LBA format: $(grep lba_bytes /tmp/id.txt), want 512 (QEMU's default)"
grep -qx "nsid=1" /tmp/id.txt || fail "namespace: $(grep nsid /tmp/id.txt)"
ok "$(tr '\n' ' ' </tmp/id.txt)"
check identify "$B" >/tmp/idb.txt 2>&1 || fail "identify B: $(cat /tmp/idb.txt)"
grep -qx "serial=chimB" /tmp/idb.txt || fail "B's serial: $(grep serial /tmp/idb.txt), want chimB"

step exercise
check exercise "$A" --ops "$OPS" --threads 2 >/tmp/ex.txt 2>&1 || fail "exercise A: $(tail -n 5 /tmp/ex.txt)"
sed 's/^/  /' /tmp/ex.txt; cp /tmp/ex.txt /results/vfio-exercise-A.txt
grep -q "^PASS exercise" /tmp/ex.txt || fail "no PASS line"
grep -qx "data pointers: SGL data blocks" /tmp/ex.txt || fail "A did not use SGLs (QEMU offers them)"
check exercise "$B" --ops 2000 --threads 2 --data prp >/tmp/exb.txt 2>&1 || fail "exercise B: $(tail -n 5 /tmp/exb.txt)"
grep -qx "data pointers: PRP lists" /tmp/exb.txt || fail "B did not use PRP lists"
ok "B (PRP lists): $(grep '^ok random' /tmp/exb.txt)"

crash() {
  DISKFS_CRASH_SEEDS=${CRASH_SEEDS:-0} DISKFS_CRASH_DEVICE=$1 "$BIN/diskfs-crash-test" --nocapture --test-threads 1 >/tmp/crash.txt 2>&1
  rc=$?
  cp /tmp/crash.txt "/results/vfio-crash-$2.txt"
  [ $rc -eq 0 ] || fail "crash states on $1: $(grep -E 'panicked|FAILED' /tmp/crash.txt | head -n 3)"
  grep -q '^test result: ok. 1 passed' /tmp/crash.txt || fail "the crash test did not run on $1"
  grep '^crash states:' /tmp/crash.txt >"/tmp/crash-$2.sum" || fail "no crash-states summary"
  ok "$2: $(cat "/tmp/crash-$2.sum")"
}
step crash-vfio
crash "vfio:$C" vfio

step bench-vfio
: >/results/vfio-bench.txt
for qd in 1 32; do
  check bench --vfio "$A" --qd $qd --seconds 3 >>/results/vfio-bench.txt 2>&1 || fail "bench vfio qd$qd: $(tail -n 2 /results/vfio-bench.txt)"
done
# The same QD1 through the queue's blocking wait: 100 us of polling, then
# asleep on the pair's MSI-X eventfd (what the tools and workers do).
check bench --vfio "$A" --qd 1 --seconds 3 --wait sleep >>/results/vfio-bench.txt 2>&1 || fail "bench vfio qd1 wait=sleep: $(tail -n 2 /results/vfio-bench.txt)"
sed 's/^/  /' /results/vfio-bench.txt

step diskfs
# DMA memory from one 1 GiB hugepage slab, as the reference config asks
# (the page is reserved at boot: test-vfio.sh gives hugepagesz=1G hugepages=1
# and 4 GiB, so a 1 GiB-aligned range is free above 4 GiB).
[ "$(cat /sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages)" -ge 1 ] || fail "no free 1 GiB hugepage in the guest: $(dmesg | grep -i 'hugetlb' | head -n 2 | tr '\n' ' ')"
cat >/tmp/c.json <<JSON
{
  "common":  { "log_level": "info", "huge_pages": true, "huge_page_size": "1G", "slab_size": "1G", "preallocate_slabs": 1 },
  "server":  { "role": "both", "bind": "127.0.0.1", "cores": 1,
               "nfs_port": $PORT, "mount_port": $MPORT, "portmap_port": 0,
               "grace_time_s": 15, "lease_time_s": 10,
               "vfs": { "diskfs": { "config": { "initialize": true,
                 "devices": [ { "type": "vfio", "path": "$A" }, { "type": "vfio", "path": "${B#0000:}" } ] } } } },
  "mounts":  { "diskfs": { "module": "diskfs", "path": "/" } },
  "exports": { "/diskfs": { "path": "/diskfs" } },
  "admin":   { "enabled": false },
  "metrics": { "enabled": true, "bind": "127.0.0.1", "port": $MPORT_METRICS }
}
JSON
"$BIN/chimerad" --check-config --config /tmp/c.json >/tmp/check.txt 2>&1 || fail "config refused: $(cat /tmp/check.txt)"
start() {
  from=$(cat $LOG 2>/dev/null | wc -l)
  "$BIN/chimerad" --config /tmp/c.json >>$LOG 2>&1 &
  pid=$!
  i=0
  until tail -n +"$((from + 1))" $LOG | grep -q '"service":"mount"'; do
    kill -0 $pid 2>/dev/null || { pid=""; fail "chimerad exited at start: $(tail -n 5 $LOG)"; }
    i=$((i + 1)); [ $i -lt 1800 ] || fail "chimerad did not listen within 180 s"
    sleep 0.1
  done
}
start
grep -q '"nvme device"' $LOG || fail "no nvme device line in the log"
grep '"nvme device"' $LOG | grep -q '"irq_vectors":[1-9]' || fail "the devices have no completion interrupts: $(grep '"nvme device"' $LOG | head -n 1)"
irqs() { awk '/vfio-msix/ { for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i } END { print n + 0 }' /proc/interrupts; }
irq0=$(irqs)
grep '"msg":"hugepages"' $LOG | grep -q '"page_bytes":1073741824' || fail "no 1 GiB hugepage slab mapped: $(grep hugepages $LOG)"
ok "chimerad on diskfs over vfio $A and ${B#0000:}: $(grep -c '"nvme device"' $LOG) devices; $(grep '"msg":"hugepages"' $LOG | tail -n 1)"
for v in 3 4.1; do
  step "workload-vers$v"
  NFS_VERS=$v NFS_PORT=$PORT NFS_MOUNT_PORT=$MPORT NFS_SERVER=127.0.0.1 NFS_EXPORT=/diskfs \
    NFS_DATA_MIB=${NFS_DATA_MIB:-16} NFS_SECOND_CLIENT=none dash "$BIN/nfs-workload.sh" >/tmp/wl.txt 2>&1 &
  wl=$!
  # Bounded (it takes well under a minute): a hang fails with what each
  # side was doing, not at the guest's own timeout with nothing.
  i=0
  while kill -0 $wl 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 3000 ]; then
      echo "  --- the workload at vers=$v is still running after 300 s; so far:"; sed 's/^/  /' /tmp/wl.txt
      echo "  --- blocked tasks (state D) and chimerad's threads:"
      for t in /proc/[0-9]*/task/[0-9]*; do
        st=$(awk '{ print $3 }' $t/stat 2>/dev/null)
        case "$t" in /proc/$pid/task/*) ;; *) [ "$st" = D ] || continue ;; esac
        echo "  $t $(cat $t/comm 2>/dev/null) state=$st wchan=$(cat $t/wchan 2>/dev/null)"
        [ "$st" = D ] && sed 's/^/      /' $t/stack 2>/dev/null | head -n 12
      done
      wget -qO - "http://127.0.0.1:$MPORT_METRICS/metrics" 2>/dev/null | grep -E '^chimera_(device|rpc_parked|calls_parked|nfs3_calls)' | head -n 40 | sed 's/^/  /'
      grep -i nfs /proc/self/mountstats 2>/dev/null | head -n 5
      fail "the kernel-client workload hung at vers=$v (300 s)"
    fi
    sleep 0.1
  done
  wait $wl
  rc=$?
  sed 's/^/  /' /tmp/wl.txt
  [ $rc -eq 0 ] || fail "the kernel-client workload failed at vers=$v"
  ok "kernel-client workload passed at vers=$v on diskfs over vfio"
done
step interrupts
# The cores slept on the queues' MSI-X eventfds while I/O was in flight:
# the controllers' interrupts reached them through VFIO.
irq1=$(irqs)
[ "$irq1" -gt "$irq0" ] || fail "no MSI-X interrupts from the controllers during the workload ($irq0 -> $irq1): $(grep vfio-msix /proc/interrupts | head -n 3)"
ok "$((irq1 - irq0)) MSI-X interrupts from the controllers during the workload ($(grep -c vfio-msix /proc/interrupts) vectors); $(grep '"nvme device"' $LOG | head -n 1 | grep -o '"irq_vectors":[0-9]*')"
step devices-both
wget -qO /tmp/metrics.txt "http://127.0.0.1:$MPORT_METRICS/metrics" || fail "cannot scrape metrics"
grep '^chimera_device_\|^chimera_hugepage_' /tmp/metrics.txt >/results/vfio-metrics.txt
carved=$(awk '$1 == "chimera_hugepage_bytes{state=\"carved\"}" { print $2 }' /tmp/metrics.txt)
slabs=$(awk '$1 == "chimera_hugepage_slabs{page_bytes=\"1073741824\"}" { print $2 }' /tmp/metrics.txt)
[ "${carved:-0}" -gt 0 ] && [ "${slabs:-0}" = 1 ] || fail "the pools and queues are not carved from the one 1 GiB slab (slabs ${slabs:-none}, carved ${carved:-none} bytes)"
grep -q 'buffer pool: ' $LOG && fail "a pool fell back to ordinary pages: $(grep 'buffer pool: ' $LOG | head -n 1)"
ok "pools and queues: $carved bytes carved from one 1 GiB hugepage slab"
for c in $A $B; do
  w=$(awk -v d="$c" 'index($0, "chimera_device_bytes_total{device=\"" d "\",op=\"write\"}") == 1 { print $2 }' /tmp/metrics.txt)
  [ "${w:-0}" -gt 1048576 ] || fail "device $c wrote ${w:-no} bytes: the data is not on both devices"
  ok "$c: $w bytes written"
done

step restart
mkdir -p /mnt/r
mount -t nfs -o vers=4.1,port=$PORT 127.0.0.1:/diskfs /mnt/r || fail "mount"
dd if=/dev/urandom of=/tmp/src bs=1M count=16 2>/dev/null
want=$(md5sum /tmp/src | cut -d' ' -f1)
rm -f /tmp/acked
(
  i=0
  while [ $i -lt 8 ]; do
    dd if=/tmp/src of=/mnt/r/durable bs=1M skip=$((i * 2)) seek=$((i * 2)) count=2 conv=notrunc,fsync 2>/dev/null || exit 1
    echo $i >/tmp/acked
    i=$((i + 1))
  done
) &
writer=$!
i=0; until [ -s /tmp/acked ] && [ "$(cat /tmp/acked)" -ge 1 ]; do
  kill -0 $writer 2>/dev/null || fail "the writer ended early"
  i=$((i + 1)); [ $i -lt 1200 ] || fail "the writer made no progress"
  sleep 0.1
done
kill -9 $pid; wait $pid 2>/dev/null
ok "chimerad killed (SIGKILL) after chunk $(cat /tmp/acked) of 8 was acknowledged durable"
sleep 1
start
ok "restarted on the same devices: $(grep '"diskfs mounted"' $LOG | tail -n 1 | sed 's/.*"log_units_replayed":\([0-9]*\).*/\1 log units replayed/')"
wait $writer || fail "the writer saw an error across the restart"
echo 3 >/proc/sys/vm/drop_caches
got=$(md5sum /mnt/r/durable | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "checksum after the restart: $got, want $want"
umount /mnt/r || fail "umount"
ok "the writer saw no error; the file reads back with the source's checksum"
kill $pid; wait $pid 2>/dev/null; pid=""
cp $LOG /results/vfio-chimerad.log

step fsck-vfio
"$BIN/chimera-fsck" "vfio:$A" "vfio:${B#0000:}" >/results/vfio-fsck.txt 2>&1 || fail "chimera-fsck over vfio: $(tail -n 5 /results/vfio-fsck.txt)"
ok "$(tail -n 1 /results/vfio-fsck.txt)"

step bench-uring
kernel_blockdev "$A"
dev=$KDEV
for qd in 1 32; do
  check bench --uring "$dev" --qd $qd --seconds 3 >>/results/vfio-bench.txt 2>&1 || fail "bench io_uring qd$qd: $(tail -n 2 /results/vfio-bench.txt)"
done
sed 's/^/  /' /results/vfio-bench.txt

step crash-uring
kernel_blockdev "$C"
crash "$KDEV" uring
cmp -s /tmp/crash-vfio.sum /tmp/crash-uring.sum || fail "different crash-state results: vfio '$(cat /tmp/crash-vfio.sum)', io_uring '$(cat /tmp/crash-uring.sum)'"
ok "the same crash states recover the same way through vfio and io_uring"
echo "PASS nvme-vfio"
