#!/bin/sh
# Runs the kernel-client workload once per NFS version, all in one guest boot
# (runs inside the guest, dash; test-nfs.sh is the host side).
#
# For each version in NFS_VERSIONS (e.g. "3 4.1 auto"), in order:
# nfs-workload.sh (which the host copies to /results/bin) runs with NFS_VERS
# set, in its own session, killed after NFS_VERSION_TIMEOUT_S. Its output goes
# to /results/nfs-workload-vers<V>.log and then to the console. Afterwards
# whatever the version left behind is cleared before the next one starts:
# its processes (a lock holder, the second client), any NFS mount, /tmp, and
# eth1 is waited for until it is back from the second client's namespace.
# A failing version never stops the loop: every version runs and is reported.
#
# Results: one line per version appended to /results/nfs-versions.txt as soon
# as that version ends, what the host reads (so the versions that finished
# count even if the guest dies later):
#   PASS vers=<V> rc=0 secs=<S>
#   FAIL vers=<V> rc=<RC> secs=<S>        (rc 137: killed, e.g. out of time)
# and on the console "nfs-versions: PASS|FAIL vers=<V> ..." per version and a
# summary line. A version passes when the workload exits 0 and its last line
# is its own "PASS nfs-workload vers=<V>". Exits 0 only when every version
# passed.
#
# Variables (from run.sh -e): NFS_VERSIONS, NFS_VERSION_TIMEOUT_S (default
# 600), and what nfs-workload.sh reads (NFS_PORT, NFS_MOUNT_PORT, NFS_EXPORT,
# ...), which it inherits.
set -u

BIN=/results/bin
RESULTS=/results/nfs-versions.txt
VERSIONS=${NFS_VERSIONS:?NFS_VERSIONS must list the NFS versions to run}
VERSION_TIMEOUT_S=${NFS_VERSION_TIMEOUT_S:-600}
ETH1_WAIT_S_MAX=30

say() { echo "nfs-versions: $*"; }
[ -f "$BIN/nfs-workload.sh" ] || { say "FAIL: no $BIN/nfs-workload.sh (the host copies it there)"; exit 2; }
: >"$RESULTS" || { say "FAIL: cannot write $RESULTS"; exit 2; }
had_eth1=""
ip link show eth1 >/dev/null 2>&1 && had_eth1=1

# SIGKILL every process of session $1: the workload and everything it
# started (unshare and the commands busybox timeout runs keep the session;
# busybox timeout's watcher has its own and exits by itself within a second
# of its command). Repeated because a dying shell may still be forking.
kill_session() {
  ks_sid=$1 ks_round=0
  while [ $ks_round -lt 5 ]; do
    ks_left=0
    for ks_stat in /proc/[0-9]*/stat; do
      { read -r ks_line <"$ks_stat"; } 2>/dev/null || continue
      # Fields after the command name (which may hold spaces): state ppid pgrp session.
      set -- ${ks_line##*) }
      # Zombies are dead already (their parent, maybe init, reaps them).
      [ "${4:-}" = "$ks_sid" ] && [ "$1" != Z ] || continue
      ks_pid=${ks_stat#/proc/}; ks_pid=${ks_pid%/stat}
      kill -KILL "$ks_pid" 2>/dev/null && ks_left=$((ks_left + 1))
    done
    [ $ks_left -eq 0 ] && return 0
    ks_round=$((ks_round + 1))
    sleep 0.2
  done
  say "note: processes of session $ks_sid survive SIGKILL (stuck in the kernel?)"
}

# What one version may leave behind when it fails or is killed.
clean_up_after() {
  kill_session "$1"
  for m in $(awk '$3 == "nfs" || $3 == "nfs4" { print $2 }' /proc/mounts); do
    umount -f "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "note: cannot unmount $m"
  done
  # The driver keeps nothing in /tmp; a failed version can leave its 64 MiB
  # source file there (tmpfs: guest memory).
  rm -rf /tmp/* 2>/dev/null
  # The 4.x lock check moves eth1 into the second client's network namespace;
  # the kernel hands it back when that namespace goes away, asynchronously.
  if [ -n "$had_eth1" ]; then
    w=0
    until ip link show eth1 >/dev/null 2>&1; do
      [ $w -lt $((ETH1_WAIT_S_MAX * 10)) ] || { say "note: eth1 not back after ${ETH1_WAIT_S_MAX}s (the next 4.x lock check will fail)"; break; }
      sleep 0.1; w=$((w + 1))
    done
  fi
}

passed=0 failed=0 failed_list=""
for v in $VERSIONS; do
  log=/results/nfs-workload-vers$v.log
  say "---- vers=$v: nfs-workload.sh (up to ${VERSION_TIMEOUT_S}s)"
  t0=$(date +%s)
  # busybox timeout execs the command in its own pid (its watcher is a
  # separate process) and setsid execs too: $! is the workload's pid and its
  # session id.
  NFS_VERS=$v timeout -s KILL "$VERSION_TIMEOUT_S" setsid dash "$BIN/nfs-workload.sh" >"$log" 2>&1 &
  wl=$!
  wait $wl
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  clean_up_after $wl
  sed 's/^/  /' "$log"
  # A pass needs the workload's own last line too, not only its status.
  if [ $rc -eq 0 ] && grep -qx "PASS nfs-workload vers=$v" "$log"; then
    verdict=PASS; passed=$((passed + 1))
  else
    verdict=FAIL; failed=$((failed + 1)); failed_list="$failed_list $v"
    [ $rc -ne 0 ] || say "vers=$v: status 0 but no 'PASS nfs-workload vers=$v' line"
    [ $rc -ne 137 ] || say "vers=$v: killed (SIGKILL) after ${secs}s (budget ${VERSION_TIMEOUT_S}s)"
  fi
  echo "$verdict vers=$v rc=$rc secs=$secs" >>"$RESULTS"
  sync
  say "$verdict vers=$v (rc $rc, ${secs}s)"
done
say "summary: $passed passed, $failed failed${failed_list:+ (failed:$failed_list)}"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
