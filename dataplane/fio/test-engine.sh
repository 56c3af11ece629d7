#!/usr/bin/env bash
# The fio engine under real fio (make test-fio-engine): chimerad on memfs on
# 127.0.0.1 (ports it picks, read back from its log), fio with
# --ioengine=external:<engine>.
#
#   test-engine.sh FIO ENGINE_SO CHIMERAD
#
# Checks: mixed random read/write with verify=crc32c (2 jobs, 2 connections
# each, iodepth 16); 1 MiB sequential write + verify; random writes with
# fsync (COMMIT) + verify; plain NFSv4.1 (chimera_pnfs=1 against a server
# without pNFS) + verify; what the engine wrote, fio's libnfs engine reads
# back and verifies (the data is on the server, not only in the engine);
# a negative control (a verify that must fail, fails); hostile options and
# I/O sizes fail with messages that name the problem. Prints one line per
# check and a summary; exits non-zero when any failed or none ran.
set -uo pipefail

[ $# -eq 3 ] || { echo "usage: test-engine.sh FIO ENGINE_SO CHIMERAD" >&2; exit 2; }
fio=$1
engine=$2
chimerad=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
for f in "$fio" "$engine" "$chimerad"; do [ -e "$f" ] || { echo "test-engine: $f is missing" >&2; exit 2; }; done

work=$(mktemp -d "${TMPDIR:-/tmp}/chimera-fio-engine.XXXXXX")
srv=""
cleanup() {
  [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/chimerad.json" <<EOF
{ "common": { "log_level": "info" },
  "server": { "bind": "127.0.0.1", "cores": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
  "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 536870912 } },
  "exports": { "/memfs": { "path": "/memfs" } },
  "admin": { "enabled": false }, "metrics": { "enabled": false } }
EOF
(ulimit -v $((4 << 20)); exec "$chimerad" --config "$work/chimerad.json") >"$work/chimerad.log" 2>&1 &
srv=$!
read -r port < <("$repo/scripts/chimerad-ports.py" "$work/chimerad.log" "$srv" nfs --timeout 30) ||
  { cat "$work/chimerad.log" >&2; echo "test-engine: chimerad did not report its NFS port" >&2; exit 1; }

# fio writes its verify state files into the working directory.
cd "$work"
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "test-engine: PASS $*"; }
bad() { failed=$((failed + 1)); echo "test-engine: FAIL $*"; }

eng=(--ioengine="external:$engine" --chimera_server="127.0.0.1:$port" --chimera_export=/memfs)
# Runs fio (bounded in time); output in $work/NAME.out, JSON in $work/NAME.json.
run() {
  local name=$1; shift
  timeout 300 "$fio" --output-format=json --output="$work/$name.json" "$@" >"$work/$name.out" 2>&1
}
# The JSON says no job had an error and the I/O counts are what was asked.
clean() {
  python3 - "$1" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
# fio may print warnings (e.g. about verify with several jobs) before the JSON.
d = json.loads(text[text.index("{"):])
errs = [j.get("error") for j in d["jobs"] if j.get("error")]
ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in d["jobs"])
if errs or ios == 0:
    sys.exit(f"jobs with errors {errs}, {ios} I/Os")
print(f"{ios} I/Os, " + ", ".join(f"{j['jobname']} r {j['read']['iops']:.0f} w {j['write']['iops']:.0f} IOPS" for j in d["jobs"]))
EOF
}
check() {  # check NAME DESCRIPTION: fio exited 0, the JSON is clean, no engine error logged
  local name=$1 what=$2 rc=$3 summary
  if [ "$rc" -ne 0 ]; then bad "$what (fio exit $rc): $(tail -n 3 "$work/$name.out" | tr '\n' ' ')"; return; fi
  if grep -q "chimera" "$work/$name.out"; then bad "$what: the engine logged: $(grep chimera "$work/$name.out" | head -n 2 | tr '\n' ' ')"; return; fi
  if summary=$(clean "$work/$name.json" 2>&1); then ok "$what: $summary"; else bad "$what: $summary"; fi
}

run randrw "${eng[@]}" --name=randrw --filename_format='dir/randrw.$jobnum' --numjobs=2 --chimera_conns=2 \
  --rw=randrw --bs=4k --size=16m --iodepth=16 --verify=crc32c --do_verify=1 --group_reporting=0
check randrw "mixed random read/write, verify=crc32c, 2 jobs x 2 connections, iodepth 16" $?

run seq "${eng[@]}" --name=seq --filename=seq.0 --rw=write --bs=1m --size=64m --iodepth=4 --verify=crc32c --do_verify=1
check seq "1 MiB sequential write + verify, iodepth 4" $?

run fsync "${eng[@]}" --name=fsync --filename=fsync.0 --rw=randwrite --bs=8k --size=8m --iodepth=8 --fsync=16 \
  --verify=crc32c --do_verify=1
check fsync "random writes with fsync every 16 (COMMIT) + verify" $?

# Plain NFSv4.1: chimera_pnfs=1 against this server, which is no pNFS
# metadata server: the engine says so once, and every I/O goes through the
# session at depth.
run v41 "${eng[@]}" --chimera_pnfs=1 --name=v41 --filename=v41.0 --rw=randrw --bs=4k --size=8m --iodepth=16 \
  --verify=crc32c --do_verify=1
rc=$?
if grep -q "is not a pNFS metadata server: I/O goes through it over NFSv4" "$work/v41.out"; then
  sed -i '/is not a pNFS metadata server/d' "$work/v41.out"
  check v41 "NFSv4.1 without pNFS (chimera_pnfs=1, no layouts): random read/write at iodepth 16 + verify" $rc
else bad "NFSv4.1 without pNFS: the engine did not say it runs without layouts: $(tail -n 3 "$work/v41.out" | tr '\n' ' ')"; fi

# Held copies of UNSTABLE writes under a 1 MiB bound: 16 MiB of random
# writes make the engine COMMIT on its own ~16 times; the data verifies.
run hold "${eng[@]}" --name=hold --filename=hold.0 --rw=randwrite --bs=4k --size=16m --iodepth=16 --chimera_hold_mib=1 \
  --verify=crc32c --do_verify=1
check hold "random writes with held copies bounded at 1 MiB (the engine COMMITs at the bound) + verify" $?

# Back-pressure: 32 x 1 MiB writes queued on one connection are 8x the
# client's send-queue bound; the engine answers "busy" and fio reaps first
# (it used to fail the I/O with "calls wait for the socket").
run depth "${eng[@]}" --name=depth --filename=depth.0 --rw=write --bs=1m --size=96m --iodepth=32 --chimera_conns=1 \
  --verify=crc32c --do_verify=1
check depth "1 MiB writes at iodepth 32 on one connection (beyond the send bound) + verify" $?

# The sample workload (config/samples/fio) through its own run.sh, as the
# in-process-engine Job runs it: engine options in FIO_ARGS, three phases.
sample_dir="$work/sample"
mkdir -p "$sample_dir/etc" "$sample_dir/results"
cm="$repo/config/samples/fio/fio-workload-configmap.yaml"
for key in run.sh workload.fio; do
  # The key's literal block: the lines under "  KEY: |", 4-space indented.
  awk -v k="  $key: |" '$0 == k {on = 1; next} on && /^    / {print substr($0, 5); next} on && !/^$/ {on = 0} on {print ""}' "$cm" |
    sed -e "s#/etc/fio/#$sample_dir/etc/#g" -e "s#/results/#$sample_dir/results/#g" >"$sample_dir/etc/$key"
done
if (cd "$sample_dir" && PATH="$(dirname "$fio"):$PATH" SCALE=3 RUNTIME_S=2 DIRECTORY=. IOENGINE="external:$engine" \
    FIO_ARGS="--ioengine=external:$engine --chimera_server=127.0.0.1:$port --chimera_export=/memfs --chimera_conns=1" \
    timeout 300 sh etc/run.sh) >"$work/sample.out" 2>&1; then
  summary=""
  for phase in layout randwrite randread; do
    if s=$(clean "$sample_dir/results/$phase.json" 2>&1); then summary="$summary $phase: $s;"
    else summary="FAIL $phase: $s"; break; fi
  done
  case $summary in FAIL*) bad "the sample workload: $summary" ;; *) ok "the sample workload through its run.sh:$summary" ;; esac
else
  bad "the sample workload's run.sh failed: $(tail -n 3 "$work/sample.out" | tr '\n' ' ')"
fi

# Written by our engine, read back and verified by fio's libnfs engine.
run interop-w "${eng[@]}" --name=interop --filename=interop.0 --rw=write --bs=64k --size=16m --iodepth=8 \
  --verify=crc32c --do_verify=0
rc=$?
run interop-r --ioengine=nfs --nfs_url="nfs://127.0.0.1/memfs?nfsport=$port&mountport=$port" --name=interop \
  --filename=interop.0 --rw=write --bs=64k --size=16m --verify=crc32c --verify_only
rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && ! grep -q "verify:" "$work/interop-r.out"; then
  ok "written by the engine, verified by the libnfs engine"
else
  bad "interop: engine write exit $rc, libnfs verify exit $rc2: $(tail -n 3 "$work/interop-r.out" | tr '\n' ' ')"
fi

# Negative control: a verify that must fail does fail (the checks above can).
run ctl-w "${eng[@]}" --name=ctl --filename=ctl.0 --rw=write --bs=4k --size=1m --verify=pattern --verify_pattern=0xaa --do_verify=0
run ctl-r "${eng[@]}" --name=ctl --filename=ctl.0 --rw=write --bs=4k --size=1m --verify=pattern --verify_pattern=0xbb --verify_only
rc=$?
if [ $rc -ne 0 ] && grep -q "verify" "$work/ctl-r.out"; then ok "negative control: a wrong verify pattern fails (exit $rc)"
else bad "negative control: verifying 0xaa data against 0xbb passed (exit $rc)"; fi

# Hostile options: each fails, naming the problem.
expect_fail() {  # expect_fail NAME TEXT DESCRIPTION fio-args...
  local name=$1 text=$2 what=$3; shift 3
  run "$name" "$@"
  local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$text" "$work/$name.out"; then ok "$what -> fails naming '$text'"
  else bad "$what: exit $rc, output lacks '$text': $(tail -n 3 "$work/$name.out" | tr '\n' ' ')"; fi
}
expect_fail no-server "chimera_server is required" "no chimera_server" \
  --ioengine="external:$engine" --chimera_export=/memfs --name=h --filename=h --size=1m --rw=read
expect_fail bad-export "MOUNT of export /nope" "unknown export" \
  --ioengine="external:$engine" --chimera_server="127.0.0.1:$port" --chimera_export=/nope --name=h --filename=h --size=1m --rw=write
# A port that refuses connections: bound and never listening, held by a
# helper until the check is done (a closed port could be taken meanwhile).
coproc HOLD { exec python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1], flush=True); time.sleep(300)'; }
read -r dead <&"${HOLD[0]}"
expect_fail dead-server "127.0.0.1:$dead" "nothing listening" \
  --ioengine="external:$engine" --chimera_server="127.0.0.1:$dead" --chimera_export=/memfs --name=h --filename=h --size=1m --rw=write
kill "$HOLD_PID" 2>/dev/null; wait "$HOLD_PID" 2>/dev/null
expect_fail big-bs "lower bs" "a 2 MiB block" "${eng[@]}" --name=h --filename=h --size=4m --bs=2m --rw=write
expect_fail dotdot "leaves the export" "a file name with .." "${eng[@]}" --name=h --filename=../x --size=1m --rw=write
expect_fail trim "not supported" "trim" "${eng[@]}" --name=h --filename=seq.0 --size=1m --rw=trim
expect_fail retry-range "chimera_retry_s" "a reconnect window over an hour" "${eng[@]}" --chimera_retry_s=4000 --name=h --filename=seq.0 --size=1m --rw=read
expect_fail hold-range "chimera_hold_mib" "held writes over 4 GiB" "${eng[@]}" --chimera_hold_mib=5000 --name=h --filename=seq.0 --size=1m --rw=read
expect_fail transport "chimera_transport 'udp' is neither tcp nor rdma" "an unknown transport" "${eng[@]}" --chimera_transport=udp --name=h --filename=seq.0 --size=1m --rw=read
# No RDMA device here (the guest suite runs the engine over soft RoCE): the
# job fails at connect, saying it was RDMA that failed.
expect_fail rdma-none "over RDMA:" "RDMA where no RDMA device reaches the server" "${eng[@]}" --chimera_transport=rdma --name=h --filename=seq.0 --size=1m --rw=read
# A time-based read of files that do not exist ends at once (it used to
# retry the opens for its whole runtime).
t0=$(date +%s)
expect_fail missing "in export /memfs: NFS3ERR_NOENT" "a time-based read of missing files" \
  "${eng[@]}" --name=h --filename_format='missing.$filenum' --nrfiles=2 --size=1m --rw=randread --time_based --runtime=120
[ $(( $(date +%s) - t0 )) -lt 30 ] || bad "the read of missing files took $(( $(date +%s) - t0 )) s to fail (runtime 120 s)"

# The server survived all of it.
run after "${eng[@]}" --chimera_retry_s=5 --name=after --filename=seq.0 --rw=randread --bs=4k --size=64m --number_ios=2000 --iodepth=8
check after "after the hostile runs, random reads of the 1 MiB-written file" $?

echo "test-engine: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
