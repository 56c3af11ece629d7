#!/bin/sh
# Guest side of the pNFS test (runs inside the QEMU guest, under dash).
#
# Proves, from the Linux kernel client's side, that files written through an
# NFSv4.1 mount of the MDS read back bit-exact after the page cache is dropped
# and the file system is remounted (nothing cached in the client survives),
# and records the evidence of where the bytes went: /proc/self/mountstats
# (LAYOUTGET/GETDEVICEINFO counts, READ/WRITE on the MDS transport, the pNFS
# event counters), the client's TCP connections (/proc/net/tcp) and the NFS
# clients the kernel made (/proc/fs/nfsfs/servers: one per data server).
# The host judges that evidence (test-pnfs.sh); this script fails only on
# what it can see itself: mount, I/O errors, checksums, reachability.
#
# The guest runs in QEMU user networking inside the client namespace, so its
# connections to 10.77.0.x leave QEMU from the client's own address: with a
# route through the slirp gateway it sees every server at its own address, as
# on a cluster.
#
# Inputs (run.sh -e): PNFS_MDS (MDS address), PNFS_SUBNET (storage subnet),
# PNFS_DS_ADDRS (space-separated DS addresses), PNFS_EXPORT, PNFS_NFS_PORT,
# PNFS_EXPECT ("name:sha256 ..." for the files in /results/in/),
# PNFS_HOST_SYNC (1: after writing, wait for the host, e.g. to stop a DS),
# PNFS_EXPECT2 (files written after the host's answer, then read back too),
# PNFS_READ_ERRORS_OK (1: a file whose read fails with an I/O error is
# recorded as "ERROR" instead of failing the run — the single-copy DS failure
# case, where an error is an allowed outcome and wrong data never is).
set -u

MDS=${PNFS_MDS:?}
SUBNET=${PNFS_SUBNET:?}
DS_ADDRS=${PNFS_DS_ADDRS:?}
EXPORT=${PNFS_EXPORT:?}
PORT=${PNFS_NFS_PORT:?}
EXPECT=${PNFS_EXPECT:?}
HOST_SYNC=${PNFS_HOST_SYNC:-0}
EXPECT2=${PNFS_EXPECT2:-}
READ_ERRORS_OK=${PNFS_READ_ERRORS_OK:-0}
HOST_WAIT_S_MAX=300     # the host stops a DS in well under this
MNT=/mnt/pnfs
IN=/results/in
STEP=setup

step() { STEP=$1; echo "---- step: $STEP ($(date +%s))"; }
ok() { echo "ok   [$STEP] $*"; }
evidence() {  # $1: suffix
  cp /proc/self/mountstats "/results/mountstats-$1.txt" 2>/dev/null
  cp /proc/net/tcp "/results/tcp-$1.txt" 2>/dev/null
  cp /proc/fs/nfsfs/servers "/results/nfsfs-servers-$1.txt" 2>/dev/null
}
fail() {
  echo "FAIL [$STEP] $*"
  evidence fail
  dmesg | tail -n 30
  exit 1
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches || fail "cannot drop caches"; }
# soft + bounded retries: a dead server becomes EIO and a FAIL line, not a
# guest hung in D state until the host's timeout.
# PNFS_NFS_VERS: 4.1 (default) or 4.2 (the flex-files reports then go as
# the 4.2 operations LAYOUTSTATS / LAYOUTERROR they are).
OPTS="vers=${PNFS_NFS_VERS:-4.1},proto=tcp,port=$PORT,soft,timeo=100,retrans=3"
do_mount() { mount -t nfs -o "$OPTS" "$MDS:$EXPORT" "$MNT" || fail "mount -o $OPTS $MDS:$EXPORT failed"; }

step network
ip route add "$SUBNET" via 10.0.2.2 dev eth0 || fail "cannot route $SUBNET through the slirp gateway"
for a in $MDS $DS_ADDRS; do
  # Connect and close at once (stdin is empty): proves the TCP path only.
  nc -w 5 "$a" "$PORT" </dev/null || fail "cannot connect to $a:$PORT"
done
ok "MDS $MDS and data servers $DS_ADDRS reachable on port $PORT through 10.0.2.2"

step modules
# The kernel asks for the layout driver through modprobe when the first
# layout arrives; loading it up front makes a missing module a clear failure.
modprobe nfs_layout_flexfiles || fail "modprobe nfs_layout_flexfiles"
ok "flex-files layout driver loaded"

step mount
mkdir -p "$MNT"
do_mount
ok "$(awk -v m="$MNT" '$2 == m' /proc/mounts)"

step write
D=$MNT/pnfs-$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir "$D" || fail "mkdir $D"
write_files() {  # "name:sha256 ..."
  bytes=0
  t0=$(date +%s)
  for e in $1; do
    n=${e%%:*}
    [ -f "$IN/$n" ] || fail "input $IN/$n missing"
    # conv=fsync: the data (and the LAYOUTCOMMIT) reach the servers before dd
    # returns, so a write error shows here.
    dd if="$IN/$n" of="$D/$n" bs=1M conv=fsync 2>/tmp/dd.err || fail "writing $n: $(cat /tmp/dd.err)"
    bytes=$((bytes + $(stat -c %s "$IN/$n")))
  done
  ok "$bytes bytes in $(( $(date +%s) - t0 ))s"
}
write_files "$EXPECT"
evidence write

if [ "$HOST_SYNC" = 1 ]; then
  step host-sync
  : >/results/guest-written
  waited=0
  until [ -e /results/host-go ]; do
    [ $waited -lt $((HOST_WAIT_S_MAX * 10)) ] || fail "the host did not answer within ${HOST_WAIT_S_MAX}s"
    sleep 0.1; waited=$((waited + 1))
  done
  ok "host says: $(cat /results/host-go)"
  if [ -n "$EXPECT2" ]; then
    # Files created after the host changed the cluster (e.g. the DS list).
    step write-after-sync
    write_files "$EXPECT2"
    evidence write2
    EXPECT="$EXPECT $EXPECT2"
  fi
fi

step remount
umount "$MNT" || fail "umount after writing"
drop_caches
do_mount
ok "remounted, page cache dropped"

step read-back
t0=$(date +%s)
: >/results/sums-read.txt
for e in $EXPECT; do
  n=${e%%:*}; want=${e#*:}
  t1=$(date +%s)
  if ! sha256sum "$D/$n" >/tmp/sum 2>/tmp/sum.err; then
    [ "$READ_ERRORS_OK" = 1 ] || fail "reading $n failed: $(cat /tmp/sum.err)"
    echo "$n ERROR" >>/results/sums-read.txt
    ok "$n: read failed with an error after $(( $(date +%s) - t1 ))s (allowed here): $(cat /tmp/sum.err)"
    continue
  fi
  got=$(cut -d' ' -f1 /tmp/sum)
  [ -n "$got" ] || fail "reading $n gave no checksum"
  echo "$n $got" >>/results/sums-read.txt
  if [ "$got" != "$want" ]; then
    # The host names the wrong records (each says which file and offset it
    # was written for), so keep what was read; check the other files too.
    cp "$D/$n" "/results/bad-$n" 2>/dev/null
    echo "FAIL [$STEP] $n: read back sha256 $got, want $want (copy in /results/bad-$n)"
    bad_files="${bad_files:-}$n "
    continue
  fi
  ok "$n sha256 $got"
done
[ -z "${bad_files:-}" ] || fail "wrong data read back: $bad_files"
ok "all files read in $(( $(date +%s) - t0 ))s"
evidence read

step cleanup
if [ "$READ_ERRORS_OK" = 1 ]; then
  # Files may sit on a dead DS: removing them is not part of the proof.
  rm -rf "$D" || echo "note [$STEP] rm -rf $D failed (a data server is down)"
else
  rm -rf "$D" || fail "rm -rf $D"
fi
umount "$MNT" || fail "umount"
ok "removed and unmounted"
echo "PASS pnfs guest-io"
