#!/bin/sh
# A writer that keeps writing while the server is killed and restarted
# (runs inside the guest; the host side is test-restart.sh).
#
# Mounts NFS_VERS from 10.0.2.2:NFS_EXPORT (hard mount, the default), writes
# a 64 MiB file of random bytes 4 MiB at a time (each flushed at close as
# several UNSTABLE WRITEs and a COMMIT) with a short pause between chunks,
# every fourth chunk with fsync(2) — so unstable writes are in flight when
# the server dies and must be resent after its write verifier changes (the
# run fails if the client sent no COMMIT at all). It tells
# the host when it is writing (/results/writer-started) and when it is done
# (/results/writer-done). The application must see no error: every dd and
# fsync succeeds, and after a page-cache drop the file reads back with the
# source's checksum.
set -u
VERS=${NFS_VERS:?}
PORT=${NFS_PORT:?}
EXPORT=${NFS_EXPORT:?}
CHUNKS=16
CHUNK_MIB=4
MNT=/mnt/nfs
STEP=setup
fail() { echo "FAIL [restart $STEP] $*"; cp /proc/self/mountstats "/results/mountstats-restart-vers$VERS.txt" 2>/dev/null; dmesg | tail -n 30; exit 1; }
step() { STEP=$1; echo "---- step: $STEP"; }

step mount
mkdir -p "$MNT"
if [ "$VERS" = 3 ]; then
  OPTS="vers=3,proto=tcp,port=$PORT,mountport=${NFS_MOUNT_PORT:?},mountproto=tcp,nolock"
else
  OPTS="vers=$VERS,proto=tcp,port=$PORT"
fi
mount -t nfs -o "$OPTS" "10.0.2.2:$EXPORT" "$MNT" || fail "mount -o $OPTS"

step source
dd if=/dev/urandom of=/tmp/src bs=1M count=$((CHUNKS * CHUNK_MIB)) 2>/dev/null || fail "cannot make the source"
want=$(md5sum /tmp/src | cut -d' ' -f1)

step write
f="$MNT/restart-$VERS"
rm -f "$f"
i=0
while [ $i -lt $CHUNKS ]; do
  if [ $((i % 4)) -eq 3 ]; then
    # fsync(2) of the file: WRITE + COMMIT of what is dirty.
    dd if=/tmp/src of="$f" bs=1M skip=$((i * CHUNK_MIB)) seek=$((i * CHUNK_MIB)) count=$CHUNK_MIB conv=notrunc,fsync 2>/dev/null || fail "dd (fsync) of chunk $i failed"
  else
    dd if=/tmp/src of="$f" bs=1M skip=$((i * CHUNK_MIB)) seek=$((i * CHUNK_MIB)) count=$CHUNK_MIB conv=notrunc 2>/dev/null || fail "dd of chunk $i failed"
  fi
  [ $i -eq 1 ] && date +%s > /results/writer-started
  sleep 0.5
  i=$((i + 1))
done
dd if=/dev/null of="$f" bs=1 count=0 seek=$((CHUNKS * CHUNK_MIB << 20)) conv=notrunc,fsync 2>/dev/null || fail "final fsync failed"
date +%s > /results/writer-done

step verify
echo 3 > /proc/sys/vm/drop_caches
got=$(md5sum "$f" | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "checksum after restart: $got, want $want"
size=$(stat -c %s "$f")
[ "$size" -eq $((CHUNKS * CHUNK_MIB << 20)) ] || fail "size $size"
commits=$(awk '$1 == "COMMIT:" { print $2; exit }' /proc/self/mountstats)
[ "${commits:-0}" -gt 0 ] || fail "the client sent no COMMIT: the unstable-write path was not exercised"
rm -f "$f" || fail "remove"
cp /proc/self/mountstats "/results/mountstats-restart-vers$VERS.txt" 2>/dev/null
umount "$MNT" || fail "umount"
echo "PASS restart vers=$VERS: the writer saw no error and the file's checksum matches"
