#!/usr/bin/env bash
# The kernel client across a server restart (issue 13): chimerad on diskfs
# (over a file in the cache directory) is killed with SIGKILL while a guest
# writer (tests/restart-writer.sh) keeps writing, and started again on the
# same ports; the writer must see no error and its file must read back with
# the right checksum (uncommitted writes resent: the write verifier changed;
# NFSv4.1 state reclaimed in the grace period: the client's record survived).
#
#   test-restart.sh CHIMERAD_BINARY        VERSIONS (default "3 4.1")
#
# Prints one line per version and a summary; exits non-zero when any failed
# or none ran.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
VERSIONS=${VERSIONS:-3 4.1}
RUN_TIMEOUT_S=900
NFS_PORT=22049
MNT_PORT=22048
START_WAIT_S_MAX=30
STARTED_WAIT_S_MAX=600

die() { echo "guest-restart: ERROR: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: test-restart.sh CHIMERAD_BINARY"
chimerad=$1; [ -x "$chimerad" ] || die "chimerad binary '$chimerad' is missing: run make build-dataplane"

"$here/build-image.sh" >/dev/null
OUT_DIR=${OUT_DIR:-$CACHE/guest/results/restart}
rm -rf "$OUT_DIR"; mkdir -p "$OUT_DIR"
# The device: a file on the cache's disk (O_DIRECT needs a real file system).
work="$CACHE/guest/restart-work"
rm -rf "$work"; mkdir -p "$work"
truncate -s 512M "$work/dev0.img"
cat >"$work/chimerad.json" <<JSON
{
  "common":  { "log_level": "info" },
  "server":  { "role": "both", "bind": "127.0.0.1", "cores": 1,
               "nfs_port": $NFS_PORT, "mount_port": $MNT_PORT, "portmap_port": 0,
               "grace_time_s": 30, "lease_time_s": 20,
               "vfs": { "diskfs": { "config": { "initialize": true,
                 "devices": [ { "type": "io_uring", "path": "$work/dev0.img" } ] } } } },
  "mounts":  { "diskfs": { "module": "diskfs", "path": "/" } },
  "exports": { "/diskfs": { "path": "/diskfs" } },
  "admin":   { "enabled": false },
  "metrics": { "enabled": false }
}
JSON
"$chimerad" --check-config --config "$work/chimerad.json" >/dev/null || die "chimerad rejects the test config"

srv_pid=""
start_server() {
  (ulimit -v $((4 << 20)); exec "$chimerad" --config "$work/chimerad.json") >>"$work/chimerad.log" 2>&1 &
  srv_pid=$!
  local log_from; log_from=$(wc -l <"$work/chimerad.log")
  # Wait for this start's "listening" lines (the log accumulates starts).
  local t=0
  until tail -n +"$((log_from + 1))" "$work/chimerad.log" | grep -q '"service":"mount"'; do
    kill -0 "$srv_pid" 2>/dev/null || { tail -n 20 "$work/chimerad.log" >&2; die "chimerad exited at start"; }
    t=$((t + 1)); [ $t -le $((START_WAIT_S_MAX * 10)) ] || die "chimerad did not listen within ${START_WAIT_S_MAX}s"
    sleep 0.1
  done
}
cleanup() {
  if [ -n "$srv_pid" ]; then kill "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; fi
  cp "$work/chimerad.log" "$OUT_DIR/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

passed=0; failed=0
start_server
for v in $VERSIONS; do
  rm -f "$OUT_DIR/writer-started" "$OUT_DIR/writer-done"
  "$here/run.sh" -t $RUN_TIMEOUT_S -o "$OUT_DIR" -e NFS_VERS="$v" -e NFS_PORT=$NFS_PORT -e NFS_MOUNT_PORT=$MNT_PORT \
      -e NFS_EXPORT=/diskfs "$here/tests/restart-writer.sh" >"$OUT_DIR/run-vers$v.log" 2>&1 &
  guest=$!
  verdict=""
  t=0
  until [ -e "$OUT_DIR/writer-started" ]; do
    kill -0 $guest 2>/dev/null || { verdict="the guest ended before its writer started"; break; }
    t=$((t + 1)); [ $t -le $((STARTED_WAIT_S_MAX * 10)) ] || { verdict="the writer did not start within ${STARTED_WAIT_S_MAX}s"; break; }
    sleep 0.1
  done
  if [ -z "$verdict" ]; then
    sleep 2
    [ ! -e "$OUT_DIR/writer-done" ] || verdict="the writer finished before the restart (inconclusive)"
    kill -9 "$srv_pid"; wait "$srv_pid" 2>/dev/null || true
    echo "guest-restart: vers=$v: chimerad killed (SIGKILL) mid-write; restarting"
    sleep 1
    start_server
  fi
  if wait $guest && [ -z "$verdict" ]; then
    passed=$((passed + 1)); echo "guest-restart: PASS vers=$v (writer saw no error, checksum matches after the restart)"
  else
    failed=$((failed + 1)); echo "guest-restart: FAIL vers=$v ${verdict:+($verdict)}"; tail -n 25 "$OUT_DIR/run-vers$v.log" || true
  fi
  mv "$OUT_DIR/console-restart-writer.log" "$OUT_DIR/console-restart-vers$v.log" 2>/dev/null || true
done
echo "guest-restart: $passed passed, $failed failed (results in $OUT_DIR)"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
