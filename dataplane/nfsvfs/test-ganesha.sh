#!/usr/bin/env bash
# The `nfs` module end to end with NFS-Ganesha as the remote:
#   1. chimerad (in Ganesha's namespace) serves Ganesha's /vfs as mount `g`,
#      with a handle_map file; fio with our engine writes 4 MiB through it at
#      a bounded rate and, while it writes, chimerad is killed (SIGKILL) and
#      started again on its port. The engine keeps its file handle across the
#      restart (it logs the reconnect); the job sees no error and every block
#      verifies (crc32c) through the restarted chimerad.
#   2. Ganesha's VFS handles share the root handle's shape (all but their
#      last 16 bytes), so they take the mount's stateless compact form: the
#      handle map stays empty — nothing needs remembering for them.
#   3. What went through chimerad is on Ganesha: fio's libnfs engine verifies
#      the same file straight from Ganesha's /vfs.
#   4. Negative control: the same restart with mount `g` now on Ganesha's
#      /mem fails the job (the handles kept by the engine name nothing there),
#      so check 1 can fail.
# Usage: test-ganesha.sh FIO ENGINE_SO CHIMERAD
set -euo pipefail

fio="$1" engine="$2" chimerad="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peers="$(cd "$here/../../e2e/peers" && pwd)"
export GANESHA_NETNS=chimera-nfsmod-test
export GANESHA_STATE="${TMPDIR:-/tmp}/chimera-nfsmod-ganesha-$$"
export GANESHA_NFS_PORT=12049 GANESHA_MNT_PORT=12048
work="$(mktemp -d "${TMPDIR:-/tmp}/chimera-nfsmod-XXXXXX")"
pass=0 failed=0 pid=""
say() { echo "test-nfs-module-ganesha: $*"; }
ok() { say "PASS $*"; pass=$((pass + 1)); }
bad() { say "FAIL $*"; failed=$((failed + 1)); }
stop_chimerad() {
  if [ -n "$pid" ]; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
cleanup() {
  stop_chimerad
  "$peers/ganesha.sh" stop >/dev/null 2>&1 || true
  rm -rf "$work" "$GANESHA_STATE"
}
trap cleanup EXIT
for f in "$fio" "$engine" "$chimerad"; do
  [ -x "$f" ] || [ -f "$f" ] || { say "FAIL missing $f"; exit 1; }
done

"$peers/ganesha.sh" start >/dev/null

# config MAP PORT [REMOTE]: chimerad serving Ganesha's REMOTE (/vfs) as /g,
# NFS (and MOUNT) on PORT (0: one it picks), the handle map at MAP (none
# when empty).
config() {
  local map="" remote="${3:-/vfs}"
  [ -n "$1" ] && map=", \"handle_map\": \"$1\""
  cat > "$work/chimerad.json" <<EOF
{ "common": { "log_level": "info" },
  "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": $2, "mount_port": 0, "portmap_port": 0 },
  "mounts": { "g": { "module": "nfs", "path": "127.0.0.1:$remote", "port": $GANESHA_NFS_PORT,
                     "mount_port": $GANESHA_MNT_PORT, "timeout_ms": 5000$map } },
  "exports": { "/g": { "path": "/g" } },
  "admin": { "enabled": false }, "metrics": { "enabled": false } }
EOF
}

# start_chimerad: start it in the namespace; sets pid and port (read back
# from its "listening" line, never guessed).
start_chimerad() {
  : > "$work/chimerad.log"
  ip netns exec "$GANESHA_NETNS" "$chimerad" --config "$work/chimerad.json" >> "$work/chimerad.log" 2>&1 &
  pid=$!
  local i
  for i in $(seq 1 100); do
    port="$(sed -n 's/.*"msg":"listening","service":"nfs","addr":"127.0.0.1:\([0-9]*\)".*/\1/p' "$work/chimerad.log" | head -1)"
    if [ -n "$port" ] && grep -q 'remote export connected' "$work/chimerad.log"; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { say "chimerad exited: $(tail -5 "$work/chimerad.log")"; return 1; }
    sleep 0.1
  done
  say "chimerad did not come up: $(tail -5 "$work/chimerad.log")"
  return 1
}

# run_with_restart NAME FILE MAP [REMOTE]: the engine writes FILE (4 MiB of
# 4 KiB blocks at 400 per second, depth 8) and verifies it; 1 s in, chimerad
# is killed and started again on the same port (serving REMOTE). fio's output
# goes to $work/NAME.out; fio's status is returned.
run_with_restart() {
  local name="$1" file="$2" rc=0
  ip netns exec "$GANESHA_NETNS" timeout 120 "$fio" --name="$name" --ioengine="external:$engine" \
    --chimera_server="127.0.0.1:$port" --chimera_export=/g --chimera_retry_s=20 \
    --filename="$file" --rw=randwrite --bs=4k --size=4m --iodepth=8 --rate_iops=400 \
    --verify=crc32c --do_verify=1 --verify_fatal=1 > "$work/$name.out" 2>&1 &
  local fpid=$!
  sleep 1
  local p="$port"
  stop_chimerad
  config "$3" "$p" "${4:-/vfs}"
  start_chimerad || { kill "$fpid" 2>/dev/null; wait "$fpid" 2>/dev/null; return 1; }
  wait "$fpid" || rc=$?
  return $rc
}

# 1. With the handle map: the restart is invisible.
config "$work/handles" 0
start_chimerad
if run_with_restart mapped kept.0 "$work/handles" && grep -q 'err= 0' "$work/mapped.out" &&
  grep -q 're-established' "$work/mapped.out"; then
  ok "4 MiB written through chimerad (nfs module over Ganesha) across a kill -9 and restart mid-job, verified (crc32c): $(grep -m1 -o 'chimera-fio: connection [^;]*re-established' "$work/mapped.out")"
else
  bad "the job across the restart: $(tail -15 "$work/mapped.out")"
fi
if [ ! -s "$work/handles" ]; then
  ok "Ganesha's handles took the compact form: the handle map stays empty"
else
  bad "the handle map holds $(stat -c %s "$work/handles") bytes: Ganesha's handles were mapped"
fi

# 3. The data is on Ganesha itself.
url="nfs://127.0.0.1/vfs?nfsport=$GANESHA_NFS_PORT&mountport=$GANESHA_MNT_PORT"
if ip netns exec "$GANESHA_NETNS" timeout 120 "$fio" --name=mapped --ioengine=nfs --nfs_url="$url" \
  --filename=kept.0 --rw=randwrite --bs=4k --size=4m --verify=crc32c --verify_only=1 --verify_fatal=1 \
  > "$work/direct.out" 2>&1 && grep -q 'err= 0' "$work/direct.out"; then
  ok "the file verifies read straight from Ganesha's /vfs (libnfs engine)"
else
  bad "reading the file from Ganesha: $(tail -15 "$work/direct.out")"
fi

# 4. Negative control: after the restart the mount is another export.
stop_chimerad
config "" 0
start_chimerad
if run_with_restart moved lost.0 "" /mem; then
  bad "with the mount moved to /mem the job across the restart passed: check 1 cannot fail ($(tail -5 "$work/moved.out"))"
else
  ok "negative control: the same restart onto Ganesha's /mem fails the job ($(grep -m1 -o 'failed: [^;]*' "$work/moved.out" || echo "fio failed"))"
fi
stop_chimerad

say "$pass passed, $failed failed"
[ "$failed" -eq 0 ]
