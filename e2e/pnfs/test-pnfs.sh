#!/usr/bin/env bash
# pNFS multi-host test: one MDS and three data servers, each chimerad in its
# own network namespace with its own address (topology.sh), and the Linux
# kernel client in the QEMU guest started inside a fifth namespace.
#
#   test-pnfs.sh CHIMERAD_BINARY [CASE...]
#
# FIO_ENGINE (default: chimera-fio.so next to CHIMERAD_BINARY) and FIO (default:
# what e2e/peers/fio-libnfs.sh prints) are used by the engine case only.
#
# Cases (default: all, what make test runs):
#   topology  MDS without layouts (pnfs.enabled=false) + three DSes. Proves the
#             harness: namespaces and addresses, the guest reaching the MDS and
#             each DS at its own address through slirp, a v4.1 mount of the
#             MDS, data verified by checksum after a remount, metrics scraped
#             from every server — and that without layouts every byte goes
#             through the MDS (the metrics tell the two cases apart).
#   stripe    pnfs.enabled, mirrors=1, stripe unit 1 MiB: files spanning many
#             stripe units are written and read back bit-exact; mountstats
#             shows LAYOUTGET and GETDEVICEINFO, no READ/WRITE bytes on the
#             MDS transport, the pNFS read/write events; the guest holds TCP
#             connections to every DS; every DS's metrics show written and
#             read bytes (striping) adding up to the bytes moved, the MDS's
#             show almost none.
#   mirror2   the same with mirrors=2: the DSes together received every byte
#             twice.
#   dsfail    mirrors=2; after the files are written, one DS is killed
#             (SIGKILL); the guest remounts and every byte still verifies,
#             read from the survivors.
#   dsfail1   mirrors=1, the same kill: a file with a stripe on the dead DS
#             may fail to read with an I/O error (what the server documents),
#             but no file may read back wrong, and the others verify.
#   member    the MDS starts with ds1 and ds2 only (ds3 runs, unlisted); after
#             the first files are written the host PUTs the list ds1
#             (draining), ds2, ds3 through the admin API and the guest writes
#             a new file: it lands on ds3 (and ds2), ds1 gets no new writes,
#             and every file, old and new, reads back bit-exact.
#   engine    no guest: our fio engine (chimera_pnfs=1: NFSv4.1 to the MDS,
#             flex-files layouts, NFSv3 straight to the DSes) runs from the
#             client's namespace against mirrors=2. A random read/write
#             crc32c-verify job exits clean; the DSes' metrics show every
#             written byte twice and the MDS almost no data. Then a DS
#             holding a mirror of the file is SIGKILLed under a running
#             verify job: the job completes and verifies, and a verify-only
#             pass over the same file afterwards too.
#
# PNFS_NFS_VERS=4.2 mounts NFSv4.2 instead of 4.1 (the same cases must
# pass: layouts, recalls as 4.2 callbacks, LAYOUTSTATS / LAYOUTERROR as the
# client sends them).
#
# One guest boot per guest case, servers restarted per case (fresh counters).
# Results (server configs and logs, metrics before/after, mountstats,
# /proc/net/tcp, consoles) stay in $CACHE/pnfs/results/<run>/<case>/; the
# path is printed. Prints a timeline and one PASS/FAIL line per case, then a
# summary line; exits non-zero when any case failed or none ran.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
guest=$(cd "$here/../guest" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}

NFS_PORT=2049
METRICS_PORT=9000
ADMIN_PORT=8080
STRIPE_UNIT_BYTES=$((1 << 20))
MDS_CAPACITY_BYTES=$((256 << 20))
DS_CAPACITY_BYTES=$((256 << 20))
SERVER_VMEM_KIB=$((4 << 20))     # address-space cap per chimerad: a leak fails, the box survives
START_WAIT_S_MAX=30
GUEST_RUN_TIMEOUT_S=600          # one boot + workload on a loaded 2-core box
LOCK_WAIT_S_MAX=900              # another run of this test holds the namespaces
RUNS_KEPT_MAX=10
# The data set: files spanning many stripe units (emulation moves ~8 MB/s).
# The odd-sized one ends mid-unit and mid-page.
FILES=("big.bin:$((12 << 20))" "odd.bin:$(((5 << 19) + 123))")
# Written after the DS list changed (member case).
FILES_LATE=("late.bin:$((6 << 20))")
# Tolerances. The MDS carries only metadata when layouts work; its bytes are
# judged against the bytes moved, not zero (COMPOUND headers, attributes).
MDS_BYTES_FRACTION_MAX_PCT=5     # MDS RPC bytes in+out vs the bytes moved
DS_BYTES_FRACTION_MIN_PCT=95     # DS WRITE/READ payload vs the bytes moved (x mirrors)

die() { echo "pnfs-test: ERROR: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: test-pnfs.sh CHIMERAD_BINARY [topology|stripe|mirror2|dsfail|dsfail1|member|engine]..."
chimerad=$(realpath "$1"); shift
[ -x "$chimerad" ] || die "chimerad binary '$chimerad' is missing: run make build-dataplane"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(topology stripe mirror2 dsfail dsfail1 member engine)
guest_cases=0
for c in "${cases[@]}"; do
  case "$c" in
    topology|stripe|mirror2|dsfail|dsfail1|member) guest_cases=$((guest_cases + 1)) ;;
    engine)
      # The fio engine and fio (with the engine API it was built against),
      # found the way make test-fio-engine finds them unless given.
      FIO_ENGINE=$(realpath "${FIO_ENGINE:-$(dirname "$chimerad")/chimera-fio.so}")
      [ -f "$FIO_ENGINE" ] || die "fio engine '$FIO_ENGINE' is missing: run make build-fio-engine"
      FIO=${FIO:-$("$here/../peers/fio-libnfs.sh")}
      [ -x "$FIO" ] || die "fio '$FIO' is missing (e2e/peers/fio-libnfs.sh builds it)" ;;
    *) die "unknown case '$c'" ;;
  esac
done
for t in ip ss ping curl python3 flock; do command -v $t >/dev/null || die "$t is missing (make test-pnfs installs it)"; done

t_start=$(date +%s)
tl() { echo "pnfs-test: [+$(( $(date +%s) - t_start ))s] $*"; }

# The namespaces are machine-wide names: one run at a time.
mkdir -p "$CACHE/pnfs/results"
exec 9>"$CACHE/pnfs/lock"
flock -w $LOCK_WAIT_S_MAX 9 || die "another pNFS test held $CACHE/pnfs/lock for ${LOCK_WAIT_S_MAX}s"

run_dir=$CACHE/pnfs/results/$(date -u +%Y%m%dT%H%M%SZ)-$$
mkdir -p "$run_dir"
# Keep the newest runs only.
ls -1d "$CACHE"/pnfs/results/*/ 2>/dev/null | sort | head -n -$RUNS_KEPT_MAX | xargs -r rm -rf

declare -A ADDR=()
for n in mds ds1 ds2 ds3 cli; do ADDR[$n]=$("$here/topology.sh" addr $n); done
DS_NODES=(ds1 ds2 ds3)
declare -A PID=()

stop_server() {  # $1: node, $2: signal
  local p=${PID[$1]:-}
  [ -n "$p" ] || return 0
  kill "-${2:-TERM}" "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
  PID[$1]=""
}
stop_all() { local n; for n in mds "${DS_NODES[@]}"; do stop_server $n TERM; done; }
cleanup() {
  stop_all
  "$here/topology.sh" down || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_ns() { local n=$1; shift; ip netns exec "chim-$n" "$@"; }

# Server-side proof that the guest connected, independent of timing: a rule
# in each server's namespace counts the TCP SYNs from the guest's address to
# the NFS port (no target, so it only counts). Reset per case.
syn_count_arm() {
  local n
  for n in mds "${DS_NODES[@]}"; do
    in_ns "$n" iptables -w -F INPUT
    in_ns "$n" iptables -w -A INPUT -p tcp --syn -s "${ADDR[cli]}" --dport "$NFS_PORT"
  done
}
syn_count() {  # $1: node; prints the SYNs from the guest counted since arming
  in_ns "$1" iptables -w -L INPUT -v -n -x | awk -v src="${ADDR[cli]}" '$1 ~ /^[0-9]+$/ && $0 ~ src && /dpt:/ {n = $1} END {print n + 0}'
}

write_configs() {  # $1: case dir, $2: pnfs enabled (true/false), $3: mirrors, $4...: listed DS nodes
  local d=$1 pnfs=$2 mirrors=$3 n dss=""
  shift 3
  for n in "$@"; do dss+="${dss:+, }{ \"netid\": \"tcp\", \"uaddr\": \"${ADDR[$n]}:$NFS_PORT\" }"; done
  head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$d/admin-token"
  cat >"$d/mds.json" <<EOF
{
  "common":  { "log_level": "info" },
  "server":  { "role": "mds", "bind": "${ADDR[mds]}", "cores": 1,
               "nfs_port": $NFS_PORT, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0,
               "pnfs": { "enabled": $pnfs, "stripe_unit_bytes": $STRIPE_UNIT_BYTES, "mirrors": $mirrors,
                         "data_servers": [ $dss ] } },
  "mounts":  { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": $MDS_CAPACITY_BYTES } },
  "exports": { "/memfs": { "path": "/memfs" } },
  "admin":   { "bind": "${ADDR[mds]}", "port": $ADMIN_PORT, "token_file": "$d/admin-token", "tls": false },
  "metrics": { "bind": "${ADDR[mds]}", "port": $METRICS_PORT }
}
EOF
  for n in "${DS_NODES[@]}"; do
    cat >"$d/$n.json" <<EOF
{
  "common":  { "log_level": "info" },
  "server":  { "role": "ds", "bind": "${ADDR[$n]}", "cores": 1,
               "nfs_port": $NFS_PORT, "mount_port": 0, "portmap_port": 0 },
  "mounts":  { "ds": { "module": "memfs", "path": "/", "capacity_bytes": $DS_CAPACITY_BYTES } },
  "metrics": { "bind": "${ADDR[$n]}", "port": $METRICS_PORT }
}
EOF
  done
  for n in mds "${DS_NODES[@]}"; do
    "$chimerad" --check-config --config "$d/$n.json" >/dev/null 2>"$d/$n.check" \
      || { cat "$d/$n.check" >&2; die "chimerad rejects the $n config"; }
  done
}

start_server() {  # $1: node, $2: case dir
  local n=$1 d=$2 i
  (ulimit -v $SERVER_VMEM_KIB; exec ip netns exec "chim-$n" "$chimerad" --config "$d/$n.json") >"$d/$n.log" 2>&1 &
  PID[$n]=$!
  for ((i = 0; i < START_WAIT_S_MAX * 10; i++)); do
    in_ns "$n" ss -Hltn "src ${ADDR[$n]} and sport = :$NFS_PORT" | grep -q LISTEN && return 0
    kill -0 "${PID[$n]}" 2>/dev/null || { tail -n 20 "$d/$n.log" >&2; die "$n: chimerad exited during start-up"; }
    sleep 0.1
  done
  die "$n: chimerad did not listen on ${ADDR[$n]}:$NFS_PORT within ${START_WAIT_S_MAX}s"
}

# The member case's change, as the operator would push it: ds1 draining, ds2
# kept, ds3 added. Names keep the configured ones (config-<index>) so device
# ids stay stable.
change_ds_list() {  # $1: case dir
  local body
  body="{\"dataServers\": [
    {\"name\": \"config-0\", \"address\": \"${ADDR[ds1]}:$NFS_PORT\", \"draining\": true},
    {\"name\": \"config-1\", \"address\": \"${ADDR[ds2]}:$NFS_PORT\"},
    {\"name\": \"ds3\", \"address\": \"${ADDR[ds3]}:$NFS_PORT\"}]}"
  in_ns cli curl -fsS --max-time 10 -X PUT -H "Authorization: Bearer $(cat "$1/admin-token")" \
    -H 'Content-Type: application/json' --data "$body" \
    "http://${ADDR[mds]}:$ADMIN_PORT/api/v1/dataservers" >"$1/dataservers-put.json" 2>"$1/dataservers-put.err" \
    || { cat "$1/dataservers-put.err" >&2; die "PUT /api/v1/dataservers failed"; }
}

# Prometheus text from a server, fetched from the client's namespace (as a
# scraper on the storage network would).
scrape() {  # $1: node, $2: output file
  in_ns cli curl -fsS --max-time 10 "http://${ADDR[$1]}:$METRICS_PORT/metrics" >"$2" \
    || die "cannot scrape $1's metrics at ${ADDR[$1]}:$METRICS_PORT"
}
# Sum of a metric's samples whose labels contain every given label pair.
metric_sum() {  # $1: file, $2: metric name, $3...: label="value" filters
  local f=$1 m=$2; shift 2
  awk -v m="$m" -v filt="$*" '
    BEGIN { nf = split(filt, want, " ") }
    { name = $1; sub(/\{.*/, "", name) }
    name == m {
      ok = 1
      for (i = 1; i <= nf; i++) if (index($1, want[i]) == 0) ok = 0
      if (ok) s += $NF
    }
    END { printf "%d\n", s }' "$f"
}

# Deterministic data: 64-byte records, each naming its file and offset, so a
# stripe unit read from the wrong place or the wrong DS cannot checksum right.
make_inputs() {  # $1: dir, $2...: name:size; prints "name:sha256 ..."
  python3 - "$@" <<'PY'
import hashlib, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
sums = []
for spec in sys.argv[2:]:
    name, size = spec.split(":"); size = int(size)
    rec = 64
    data = b"".join(("chimera-pnfs %s offset %012x" % (name, off)).ljust(rec - 1).encode() + b"\n"
                    for off in range(0, size + rec, rec))[:size]
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    sums.append("%s:%s" % (name, hashlib.sha256(data).hexdigest()))
print(" ".join(sums))
PY
}

# Per-operation field from mountstats for the mount at /mnt/pnfs:
# "OP: ops transmissions timeouts bytes_sent bytes_recv ...".
ms_op() {  # $1: file, $2: op, $3: field (2 = ops, 5 = bytes sent, 6 = bytes received)
  awk -v op="$2:" -v f="$3" '
    /^device / { ours = ($5 == "/mnt/pnfs") }
    ours && $1 == op { print $f; found = 1; exit }
    END { if (!found) print 0 }' "$1"
}
# events: counters; the last two on Linux 6.1 are pnfs_read and pnfs_write
# (NFSIOS_PNFS_READ, NFSIOS_PNFS_WRITE in include/linux/nfs_iostat.h).
ms_event() {  # $1: file, $2: pnfs_read | pnfs_write
  awk -v which="$2" '
    /^device / { ours = ($5 == "/mnt/pnfs") }
    ours && $1 == "events:" { print (which == "pnfs_read" ? $(NF - 1) : $NF); found = 1; exit }
    END { if (!found) print 0 }' "$1"
}
# The layout driver the client bound to the mount ("nfsv4: ... pnfs=NAME,"):
# LAYOUT_FLEX_FILES once the MDS advertised flex-files, "not configured" without.
ms_pnfs_driver() {  # $1: file
  awk '/^device / { ours = ($5 == "/mnt/pnfs") }
    ours && $1 == "nfsv4:" { if (match($0, /pnfs=[^,]*/)) print substr($0, RSTART + 5, RLENGTH - 5); exit }' "$1"
}
# RPC transports of the mount's (MDS) client: one "xprt:" line each.
ms_xprts() { awk '/^device / { ours = ($5 == "/mnt/pnfs") } ours && $1 == "xprt:" { n++ } END { print n + 0 }' "$1"; }
# RPCs sent on the MDS transport(s): field 8 of "xprt: tcp srcport bind_count
# connect_count connect_time idle_time sends recvs ..." (Linux 6.1), summed.
ms_xprt_sends() { awk '/^device / { ours = ($5 == "/mnt/pnfs") } ours && $1 == "xprt:" { n += $8 } END { print n + 0 }' "$1"; }
# Established TCP connections from the guest to ADDR:PORT in a /proc/net/tcp copy.
tcp_conns() {  # $1: file, $2: address, $3: port
  python3 - "$@" <<'PY'
import socket, struct, sys
f, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = "%08X:%04X" % (struct.unpack("<I", socket.inet_aton(addr))[0], port)
n = 0
for line in open(f).read().splitlines()[1:]:
    cols = line.split()
    if len(cols) > 3 and cols[2] == want and cols[3] == "01":   # 01 = ESTABLISHED
        n += 1
print(n)
PY
}

# For a file that read back wrong: which 1 MiB stripe units differ and what
# they hold instead (each 64-byte record names the file and offset it was
# written for, so misplaced data says where it came from; zeros say "never
# written").
explain_bad_reads() {  # $1: results dir
  local f
  for f in "$1"/bad-*; do
    [ -e "$f" ] || continue
    python3 - "$f" "$STRIPE_UNIT_BYTES" <<'PY' | sed 's/^/pnfs-test:   | /'
import re, sys
path, unit = sys.argv[1], int(sys.argv[2])
name = path.rsplit("bad-", 1)[1]
data = open(path, "rb").read()
bad = 0
for u in range(0, (len(data) + unit - 1) // unit):
    chunk = data[u * unit:(u + 1) * unit]
    wrong = []
    for off in range(0, len(chunk), 64):
        rec = chunk[off:off + 64]
        want = (("chimera-pnfs %s offset %012x" % (name, u * unit + off)).ljust(63).encode() + b"\n")[:len(rec)]
        if rec != want:
            wrong.append((u * unit + off, rec))
    if wrong:
        bad += 1
        o, rec = wrong[0]
        m = re.match(rb"chimera-pnfs (\S+) offset ([0-9a-f]{12})", rec)
        what = ("zeros" if rec.strip(b"\0") == b"" else
                "data of %s offset 0x%x" % (m.group(1).decode(), int(m.group(2), 16)) if m else repr(rec[:40]))
        print("%s stripe unit %d (offset 0x%x): %d of %d records wrong; first at 0x%x holds %s"
              % (name, u, u * unit, len(wrong), (len(chunk) + 63) // 64, o, what))
print("%s: %d of %d stripe units wrong" % (name, bad, (len(data) + unit - 1) // unit))
PY
    rm -f "$f"
  done
}

failures=()
check() {  # $1: description; the rest: a command that must succeed
  local what=$1; shift
  if "$@"; then echo "pnfs-test:   ok   $what"; else echo "pnfs-test:   FAIL $what"; failures+=("$what"); fi
}
ge() { [ "$1" -ge "$2" ]; }
le() { [ "$1" -le "$2" ]; }

run_case() {  # $1: case name
  local c=$1 d=$run_dir/$1 pnfs=true mirrors=1 sync=0 victim="" errors_ok=0 n
  local listed=("${DS_NODES[@]}") late=()
  case "$c" in
    topology) pnfs=false ;;
    mirror2) mirrors=2 ;;
    dsfail) mirrors=2; sync=1; victim=ds2 ;;
    dsfail1) sync=1; victim=ds2; errors_ok=1 ;;
    member) sync=1; listed=(ds1 ds2); late=("${FILES_LATE[@]}") ;;
  esac
  mkdir -p "$d/results"
  failures=()
  tl "$c: configs (pnfs.enabled=$pnfs mirrors=$mirrors stripe_unit_bytes=$STRIPE_UNIT_BYTES)"
  write_configs "$d" $pnfs $mirrors "${listed[@]}"
  for n in "${DS_NODES[@]}" mds; do start_server $n "$d"; done
  tl "$c: servers up: mds ${ADDR[mds]}, ${DS_NODES[*]} ${ADDR[ds1]} ${ADDR[ds2]} ${ADDR[ds3]} (port $NFS_PORT)"
  local expect expect2="" bytes=0 spec
  expect=$(make_inputs "$d/results/in" "${FILES[@]}")
  [ ${#late[@]} -eq 0 ] || expect2=$(make_inputs "$d/results/in" "${late[@]}")
  for spec in "${FILES[@]}" "${late[@]}"; do bytes=$((bytes + ${spec#*:})); done
  for n in mds "${DS_NODES[@]}"; do scrape $n "$d/metrics-$n-before.txt"; done
  syn_count_arm

  tl "$c: guest boots in chim-cli (${ADDR[cli]}); $bytes bytes in ${#FILES[@]} files"
  local args=(-t $GUEST_RUN_TIMEOUT_S -o "$d/results" -e PNFS_MDS="${ADDR[mds]}" -e PNFS_SUBNET="${ADDR[mds]%.*}.0/24"
    -e PNFS_DS_ADDRS="${ADDR[ds1]} ${ADDR[ds2]} ${ADDR[ds3]}" -e PNFS_EXPORT=/memfs -e PNFS_NFS_PORT=$NFS_PORT
    -e PNFS_EXPECT="$expect" -e PNFS_HOST_SYNC=$sync -e PNFS_READ_ERRORS_OK=$errors_ok -e PNFS_EXPECT2="$expect2"
    -e PNFS_NFS_VERS="${PNFS_NFS_VERS:-4.1}")
  in_ns cli "$guest/run.sh" "${args[@]}" "$here/guest-io.sh" >"$d/guest.out" 2>&1 &
  local guest_pid=$! guest_rc=0 i
  # Who the servers see: their established NFS connections, sampled once a
  # second while the guest runs (each line: node, local, peer).
  ( while kill -0 $guest_pid 2>/dev/null; do
      for n in mds "${DS_NODES[@]}"; do
        in_ns "$n" ss -Htn state established "sport = :$NFS_PORT" 2>/dev/null | awk -v n=$n '{print n, $(NF-1), $NF}'
      done
      sleep 1
    done | sort -u >"$d/server-conns.txt" ) &
  local sampler_pid=$!
  if [ "$sync" = 1 ]; then
    # Wait for the guest's "written" marker (bounded by the guest run), then
    # kill the victim DS or change the DS list, and let the guest go on.
    while [ ! -e "$d/results/guest-written" ] && kill -0 $guest_pid 2>/dev/null; do sleep 0.2; done
    if [ -e "$d/results/guest-written" ] && [ "$c" = member ]; then
      for n in "${DS_NODES[@]}"; do scrape $n "$d/metrics-$n-at-sync.txt"; done
      change_ds_list "$d"
      tl "$c: files written; DS list is now ds1 (draining), ds2, ds3 (added)"
      echo "data-server list changed" >"$d/results/host-go"
    elif [ -e "$d/results/guest-written" ]; then
      scrape $victim "$d/metrics-$victim-at-kill.txt"
      stop_server $victim KILL
      tl "$c: files written; $victim (${ADDR[$victim]}) killed with SIGKILL"
      echo "$victim stopped" >"$d/results/host-go"
    fi
  fi
  wait $guest_pid || guest_rc=$?
  wait $sampler_pid || true
  grep -E '^\[guest [^]]*\] (ok|FAIL|PASS|----)|^guest-run:' "$d/guest.out" | sed 's/^/pnfs-test:   | /' || true
  tl "$c: guest finished (rc $guest_rc)"
  for n in mds "${DS_NODES[@]}"; do
    [ "$n" = "$victim" ] && continue
    scrape $n "$d/metrics-$n-after.txt"
  done
  in_ns cli curl -fsS --max-time 10 -H "Authorization: Bearer $(cat "$d/admin-token")" \
    "http://${ADDR[mds]}:$ADMIN_PORT/api/v1/cluster" >"$d/cluster.json" 2>"$d/cluster.err" || true
  [ -n "$victim" ] && [ -f "$d/metrics-$victim-at-kill.txt" ] && cp "$d/metrics-$victim-at-kill.txt" "$d/metrics-$victim-after.txt"
  rm -rf "$d/results/in"
  declare -A SYN=()
  for n in mds "${DS_NODES[@]}"; do SYN[$n]=$(syn_count $n); echo "$n ${SYN[$n]}"; done >"$d/guest-syns.txt"

  # ---- assertions
  check "guest workload passed (mount, write, remount, checksums)" [ "$guest_rc" = 0 ]
  local sums_ok=1 e wrong=0 errs=0 good=0 got
  for e in $expect $expect2; do
    got=$(awk -v n="${e%%:*}" '$1 == n {print $2}' "$d/results/sums-read.txt" 2>/dev/null)
    if [ "$got" = "${e#*:}" ]; then good=$((good + 1))
    elif [ "$got" = ERROR ]; then errs=$((errs + 1)); sums_ok=0
    else wrong=$((wrong + 1)); sums_ok=0
    fi
  done
  if [ "$c" = dsfail1 ]; then
    # Single copy: an I/O error is allowed for a file that had a stripe on the
    # dead DS; wrong data never is, and something must have been read.
    echo "pnfs-test:   single copy, ${victim} dead: $good file(s) verified, $errs read error(s), $wrong wrong"
    check "no file read back wrong with one DS dead and mirrors=1 ($good verified, $errs I/O errors)" \
      eval '[ $wrong = 0 ] && [ $((good + errs)) = $(echo $expect | wc -w) ]'
  else
    check "read-back sha256 of every file equals the host's" [ $sums_ok = 1 ]
  fi
  explain_bad_reads "$d/results"
  local w=$d/results/mountstats-write.txt r=$d/results/mountstats-read.txt
  if [ ! -s "$w" ] || [ ! -s "$r" ]; then
    check "guest saved mountstats after writing and after reading" false
    return
  fi
  local lg gdi mds_wr mds_rd ev_pr ev_pw
  lg=$(( $(ms_op "$w" LAYOUTGET 2) + $(ms_op "$r" LAYOUTGET 2) ))
  gdi=$(( $(ms_op "$w" GETDEVICEINFO 2) + $(ms_op "$r" GETDEVICEINFO 2) ))
  mds_wr=$(ms_op "$w" WRITE 5); mds_rd=$(ms_op "$r" READ 6)
  ev_pw=$(ms_event "$w" pnfs_write); ev_pr=$(ms_event "$r" pnfs_read)
  local drv xprts
  drv=$(ms_pnfs_driver "$w"); xprts=$(ms_xprts "$w")
  echo "pnfs-test:   mountstats: layout driver '$drv', $xprts MDS transport(s); bytes: $(awk '/^device / { ours = ($5 == "/mnt/pnfs") } ours && $1 == "bytes:" { print "serverwritten " $7; exit }' "$w"), $(awk '/^device / { ours = ($5 == "/mnt/pnfs") } ours && $1 == "bytes:" { print "serverread " $6; exit }' "$r")"
  echo "pnfs-test:   mountstats: LAYOUTGET $lg, GETDEVICEINFO $gdi; per-op (the mount's, DS I/O included) WRITE $(ms_op "$w" WRITE 2) ops / $mds_wr bytes sent, READ $(ms_op "$r" READ 2) ops / $mds_rd bytes received; MDS transport sends: write phase $(ms_xprt_sends "$w"), read phase $(ms_xprt_sends "$r"); events pnfs_write $ev_pw, pnfs_read $ev_pr"
  local tcp_line="" conns f tcp_file=$d/results/tcp-write.txt
  # After the last write: in the member case ds3 only serves the late file.
  [ -s "$d/results/tcp-write2.txt" ] && tcp_file=$d/results/tcp-write2.txt
  for n in "${DS_NODES[@]}"; do
    # The member case's ds1 is drained at the change: once the client has
    # returned the recalled layouts naming it, it may close its connection
    # (Linux 6.1 does), so ds1 is judged on the sample after the first files.
    f=$tcp_file
    if [ "$c" = member ] && [ "$n" = ds1 ]; then f=$d/results/tcp-write.txt; fi
    conns=$(tcp_conns "$f" "${ADDR[$n]}" $NFS_PORT)
    tcp_line+=" $n=$conns"
    eval "conns_$n=$conns"
  done
  echo "pnfs-test:   guest TCP connections to the DSes after writing:$tcp_line; kernel NFS clients: $(awk 'NR>1 {printf "%s(v%s) ", $5, substr($1,2)}' "$d/results/nfsfs-servers-write.txt" 2>/dev/null)"

  local mds_in mds_out line="" wsum=0 rsum=0 ds_w ds_r ds_acc
  mds_in=$(metric_sum "$d/metrics-mds-after.txt" chimera_rpc_received_bytes_total)
  mds_out=$(metric_sum "$d/metrics-mds-after.txt" chimera_rpc_sent_bytes_total)
  declare -A DSW=() DSR=() DSACC=()
  for n in "${DS_NODES[@]}"; do
    ds_w=$(metric_sum "$d/metrics-$n-after.txt" chimera_rpc_received_bytes_total 'program="nfs3"' 'op="write"')
    ds_r=$(metric_sum "$d/metrics-$n-after.txt" chimera_rpc_sent_bytes_total 'program="nfs3"' 'op="read"')
    ds_acc=$(metric_sum "$d/metrics-$n-after.txt" chimera_connections_accepted_total)
    DSW[$n]=$ds_w; DSR[$n]=$ds_r; DSACC[$n]=$ds_acc
    wsum=$((wsum + ds_w)); rsum=$((rsum + ds_r))
    line+=" $n write-in=$ds_w read-out=$ds_r conns=$ds_acc;"
  done
  echo "pnfs-test:   metrics: mds rpc-in=$mds_in rpc-out=$mds_out;$line bytes moved $bytes each way"

  local peers_seen
  peers_seen=$(awk '{sub(/:[0-9]+$/, "", $3); print $1 "<-" $3}' "$d/server-conns.txt" | sort -u | tr '\n' ' ')
  echo "pnfs-test:   NFS connections the servers saw (node<-peer): $peers_seen"
  echo "pnfs-test:   TCP SYNs from the guest (${ADDR[cli]}) counted in each server's namespace: $(tr '\n' ' ' <"$d/guest-syns.txt")"
  check "the MDS saw the guest's mount come from the client's address ${ADDR[cli]} (${SYN[mds]} SYNs)" \
    ge "${SYN[mds]}" 1

  if [ "$c" = topology ]; then
    # Without layouts the MDS serves the data itself; the DSes saw only the
    # guest's connection probes. This is the contrast the pNFS cases invert.
    check "no layouts without pnfs.enabled (LAYOUTGET $lg, layout driver '$drv')" eval '[ "$lg" = 0 ] && [ "$drv" = "not configured" ]'
    check "mountstats: per-op WRITE bytes ($mds_wr) >= bytes written ($bytes)" ge "$mds_wr" "$bytes"
    check "mountstats: the MDS transport carried every READ (sends $(ms_xprt_sends "$r") >= READs $(ms_op "$r" READ 2))" \
      ge "$(ms_xprt_sends "$r")" "$(ms_op "$r" READ 2)"
    check "MDS metrics: RPC bytes received ($mds_in) >= bytes written ($bytes)" ge "$mds_in" "$bytes"
    check "MDS metrics: RPC bytes sent ($mds_out) >= bytes read ($bytes)" ge "$mds_out" "$bytes"
    for n in "${DS_NODES[@]}"; do
      check "$n (${ADDR[$n]}) accepted the guest's connection (chimera_connections_accepted_total ${DSACC[$n]})" ge "${DSACC[$n]}" 1
      check "$n received no data without layouts (${DSW[$n]})" [ "${DSW[$n]}" = 0 ]
    done
    return
  fi

  local mds_max=$((bytes * MDS_BYTES_FRACTION_MAX_PCT / 100))
  local wmin=$((bytes * mirrors * DS_BYTES_FRACTION_MIN_PCT / 100)) rmin=$((bytes * DS_BYTES_FRACTION_MIN_PCT / 100))
  local granted proxied
  granted=$(metric_sum "$d/metrics-mds-after.txt" chimera_pnfs_layouts_granted_total)
  proxied=$(metric_sum "$d/metrics-mds-after.txt" chimera_pnfs_mds_io_bytes_total)
  echo "pnfs-test:   MDS pNFS metrics: layouts granted $granted, I/O proxied through the MDS $proxied bytes; per DS: $(grep -E '^chimera_pnfs_ds_(layouts_granted_total|files|healthy)' "$d/metrics-mds-after.txt" | tr '\n' ' ')"
  # What the MDS says about each DS (admin API), for the record.
  python3 - "$d/cluster.json" <<'PY' || true
import json, sys
try:
    c = json.load(open(sys.argv[1]))
except Exception as e:
    print("pnfs-test:   /api/v1/cluster unreadable: %s" % e); sys.exit(0)
p = c.get("pnfs", {})
for ds in p.get("dataServers", []) if isinstance(p.get("dataServers"), list) else []:
    print("pnfs-test:   MDS view of %s %s: healthy=%s draining=%s files=%s layoutsGranted=%s errors=%s" % (
        ds.get("name"), ds.get("address"), ds.get("healthy"), ds.get("draining"), ds.get("files"),
        ds.get("layoutsGranted"), ds.get("errors")))
PY
  check "the client bound the flex-files layout driver (mountstats pnfs=$drv)" [ "$drv" = LAYOUT_FLEX_FILES ]
  if [ "$mirrors" = 1 ]; then
    check "LAYOUTGET happened ($lg)" ge "$lg" 1
  else
    # A mirrored file gets one whole-file layout, which the MDS returns
    # inside the OPEN compound when the client asks there (Linux does):
    # mountstats then counts it under OPEN, not LAYOUTGET.
    check "layouts reached the client: LAYOUTGET ops ($lg), or in OPEN: MDS granted $granted and the client did pNFS writes ($ev_pw)" \
      eval '[ "$lg" -ge 1 ] || { [ "$granted" -ge 1 ] && [ "$ev_pw" -ge 1 ]; }'
  fi
  check "MDS metrics: layouts granted ($granted)" ge "$granted" 1
  check "GETDEVICEINFO happened ($gdi)" ge "$gdi" 1
  check "pNFS write events counted by the client ($ev_pw)" ge "$ev_pw" 1
  check "MDS metrics: RPC bytes received ($mds_in) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of $bytes" le "$mds_in" "$mds_max"
  check "DS metrics: WRITE bytes on the DSes ($wsum) >= ${DS_BYTES_FRACTION_MIN_PCT}% of $bytes x $mirrors mirror(s)" ge "$wsum" "$wmin"
  # The read path. With one copy and its DS dead the client may fall back to
  # I/O through the MDS (the kernel does unless the layout forbids it): the
  # single-copy case judges the data only. A draining DS gets no new layouts,
  # so the files that have data on it are read through the MDS (which reads
  # the DS for the client): the member case bounds that instead.
  if [ "$c" = member ]; then
    local old_bytes=0
    for spec in "${FILES[@]}"; do old_bytes=$((old_bytes + ${spec#*:})); done
    check "MDS metrics: I/O proxied through the MDS ($proxied) <= the bytes of the files placed before the drain ($old_bytes)" \
      le "$proxied" "$old_bytes"
    check "DS metrics: READ bytes from the DSes ($rsum) >= ${DS_BYTES_FRACTION_MIN_PCT}% of $bytes (direct or through the MDS)" ge "$rsum" "$rmin"
  elif [ "$c" != dsfail1 ]; then
    check "pNFS read events counted by the client ($ev_pr)" ge "$ev_pr" 1
    # mountstats' per-op READ/WRITE lines cannot tell: on Linux 6.1 the
    # flex-files driver counts its DS RPCs into the MDS mount's per-op
    # statistics (its rpc_count_stats callbacks), so READ shows the full
    # bytes either way. The MDS transport's own counter can: every RPC it
    # carried is in "sends", and there were fewer sends than READs alone.
    local sends_r reads_r
    sends_r=$(ms_xprt_sends "$r"); reads_r=$(ms_op "$r" READ 2)
    check "mountstats: the MDS transport sent $sends_r RPCs in the read phase, fewer than its $reads_r READs (they went to the DS transports)" \
      eval '[ "$reads_r" -ge 10 ] && [ "$sends_r" -lt "$reads_r" ]'
    check "MDS metrics: RPC bytes sent ($mds_out) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of $bytes" le "$mds_out" "$mds_max"
    check "MDS metrics: I/O proxied through the MDS ($proxied) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of $bytes" le "$proxied" "$mds_max"
    check "DS metrics: READ bytes from the DSes ($rsum) >= ${DS_BYTES_FRACTION_MIN_PCT}% of $bytes" ge "$rsum" "$rmin"
  fi
  for n in "${DS_NODES[@]}"; do
    check "$n (${ADDR[$n]}) received written data (striping): ${DSW[$n]} bytes" ge "${DSW[$n]}" 1
    check "guest held a TCP connection to $n (${ADDR[$n]}:$NFS_PORT) after writing" ge "$(eval echo "\$conns_$n")" 1
  done
  # The servers' side: the SYN counters see every connection however short
  # (the 1/s connection-table samples above can miss a short write burst; a
  # CI run did, so they are kept for the record only).
  for n in "${DS_NODES[@]}"; do
    check "$n's namespace saw the guest (${ADDR[cli]}) connect to its NFS port (${SYN[$n]} SYNs)" ge "${SYN[$n]}" 1
  done
  if [ "$c" = stripe ]; then
    for n in "${DS_NODES[@]}"; do
      check "$n served reads: ${DSR[$n]} bytes" ge "${DSR[$n]}" 1
    done
  fi
  if [ -n "$victim" ]; then
    local vr_kill
    vr_kill=$(metric_sum "$d/metrics-$victim-at-kill.txt" chimera_rpc_sent_bytes_total 'program="nfs3"' 'op="read"')
    check "$victim was killed after writing (its metrics at kill: write-in ${DSW[$victim]}, read-out $vr_kill)" [ -f "$d/results/host-go" ]
    if [ "$c" = dsfail ]; then
      check "survivors served every byte read ($rsum >= ${DS_BYTES_FRACTION_MIN_PCT}% of $bytes)" ge "$rsum" "$rmin"
    fi
  fi
  if [ "$c" = member ]; then
    local w1_sync w3_sync recalled
    w1_sync=$(metric_sum "$d/metrics-ds1-at-sync.txt" chimera_rpc_received_bytes_total 'program="nfs3"' 'op="write"')
    w3_sync=$(metric_sum "$d/metrics-ds3-at-sync.txt" chimera_rpc_received_bytes_total 'program="nfs3"' 'op="write"')
    recalled=$(metric_sum "$d/metrics-mds-after.txt" chimera_pnfs_layouts_recalled_total)
    echo "pnfs-test:   membership: write bytes at the change ds1 $w1_sync, ds3 $w3_sync; after ds1 ${DSW[ds1]}, ds3 ${DSW[ds3]}; layouts recalled $recalled"
    check "the DS list was changed through the admin API after the first files" [ -f "$d/results/host-go" ]
    check "MDS metrics: layouts naming the drained ds1 were recalled ($recalled; fences $(metric_sum "$d/metrics-mds-after.txt" chimera_pnfs_fences_total))" \
      ge "$recalled" 1
    check "ds3, not yet listed, received nothing while the first files were written ($w3_sync)" [ "$w3_sync" = 0 ]
    check "ds3, added at run time, took data of the new file (${DSW[ds3]} bytes)" ge "${DSW[ds3]}" 1
    check "ds1, draining, received no new writes (${DSW[ds1]} bytes after, $w1_sync at the change)" [ "${DSW[ds1]}" = "$w1_sync" ]
    check "the MDS reports ds1 draining and ds3 listed (/api/v1/cluster)" python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
ds = {d["name"]: d for d in c["pnfs"]["dataServers"]}
sys.exit(0 if ds["config-0"]["draining"] is True and "ds3" in ds else 1)' "$d/cluster.json"
  fi
}

# ---- engine: our fio engine in pNFS mode, no guest.
# fio runs in chim-cli, the client's namespace: the one node of the topology
# made to be a client, on the storage bridge with every server (topology.sh
# check pings the MDS and every DS from it), so the servers see the engine
# at the client's address exactly as they see the guest, and the SYN
# counters and the metrics mean what they mean in the guest cases. (The
# MDS's namespace would reach the DSes too, but I/O sent from the MDS's own
# address could not be told from the MDS proxying it.)
ENGINE_BYTES=$((32 << 20))        # check 1: 8192 4 KiB I/Os, then the verify pass
ENGINE_KILL_BYTES=$((128 << 20))  # check 3: a few seconds of I/O here, well past the kill
ENGINE_KILL_AT_BYTES=$((8 << 20)) # the kill lands when a DS took this much of the job's writes
ENGINE_KILL_WAIT_S_MAX=20         # ... or this long after fio started
ENGINE_FIO_S_MAX=100              # all the case's fio runs together, at most (a hang fails, bounded)

# Runs fio from chim-cli with our engine in pNFS mode; output in
# $d/NAME.out (stdout + stderr: the engine's messages), JSON in $d/NAME.json.
# From $d: fio's verify state files stay with the results. Each run gets
# what is left of ENGINE_FIO_S_MAX since engine_deadline_ms was set.
engine_fio() {  # $1: case dir, $2: name, $3...: fio options
  local d=$1 name=$2 left; shift 2
  left=$(( (engine_deadline_ms - $(now_ms)) / 1000 ))
  [ $left -ge 1 ] || left=1
  (cd "$d" && exec ip netns exec chim-cli timeout -k 5 $left "$FIO" --output-format=json \
    --output="$d/$name.json" --ioengine="external:$FIO_ENGINE" --chimera_server="${ADDR[mds]}:$NFS_PORT" \
    --chimera_export=/memfs --chimera_pnfs=1 --name="$name" "$@") >"$d/$name.out" 2>&1
}
# fio's JSON, summed over the jobs: "error read_bytes write_bytes read_iops
# write_iops ios" (error: the first non-zero one; "unreadable" without JSON).
fio_figures() {  # $1: JSON file
  python3 - "$1" <<'PY' 2>/dev/null || echo "unreadable 0 0 0 0 0"
import json, sys
t = open(sys.argv[1]).read()
d = json.loads(t[t.index("{"):])
j = d["jobs"]
err = next((x["error"] for x in j if x.get("error")), 0)
print(err, sum(x["read"]["io_bytes"] for x in j), sum(x["write"]["io_bytes"] for x in j),
      int(sum(x["read"]["iops"] for x in j)), int(sum(x["write"]["iops"] for x in j)),
      sum(x["read"]["total_ios"] + x["write"]["total_ios"] for x in j))
PY
}
metric_delta() {  # $1: before file, $2: after file, $3...: metric_sum arguments
  local b=$1 a=$2; shift 2
  echo $(( $(metric_sum "$a" "$@") - $(metric_sum "$b" "$@") ))
}
ds_wr() { metric_sum "$1" chimera_rpc_received_bytes_total 'program="nfs3"' 'op="write"'; }
ds_rd() { metric_sum "$1" chimera_rpc_sent_bytes_total 'program="nfs3"' 'op="read"'; }
now_ms() { date +%s%3N; }
secs_since() { local t=$(( $(now_ms) - $1 )); printf '%d.%d' $((t / 1000)) $((t % 1000 / 100)); }

run_engine_case() {  # $1: case name
  local c=$1 d=$run_dir/$1 mirrors=2 n
  mkdir -p "$d"
  failures=()
  tl "$c: configs (pnfs.enabled=true mirrors=$mirrors stripe_unit_bytes=$STRIPE_UNIT_BYTES); fio with our engine from chim-cli (${ADDR[cli]})"
  write_configs "$d" true $mirrors "${DS_NODES[@]}"
  for n in "${DS_NODES[@]}" mds; do start_server $n "$d"; done
  tl "$c: servers up: mds ${ADDR[mds]}, ${DS_NODES[*]} ${ADDR[ds1]} ${ADDR[ds2]} ${ADDR[ds3]} (port $NFS_PORT)"
  for n in mds "${DS_NODES[@]}"; do scrape $n "$d/metrics-$n-before.txt"; done
  syn_count_arm
  engine_deadline_ms=$(( $(now_ms) + ENGINE_FIO_S_MAX * 1000 ))

  # 1. Mixed random read/write with crc32c verify, at depth.
  local rc=0 t0 err rb wb riops wiops ios
  t0=$(now_ms)
  engine_fio "$d" randrw --filename=engine-randrw.bin --rw=randrw --bs=4k --size=$ENGINE_BYTES --iodepth=16 \
    --verify=crc32c --do_verify=1 || rc=$?
  read -r err rb wb riops wiops ios < <(fio_figures "$d/randrw.json")
  tl "$c: randrw verify: fio exit $rc in $(secs_since $t0)s; error $err; read $rb bytes ($riops IOPS), wrote $wb bytes ($wiops IOPS), $ios I/Os"
  grep -i chimera "$d/randrw.out" | head -n 5 | sed 's/^/pnfs-test:   | engine: /' || true
  check "fio randrw verify=crc32c bs 4k iodepth 16 over pNFS exited 0 ($rc)" [ "$rc" = 0 ]
  check "fio JSON: job error 0 ($err), I/Os done ($ios)" eval '[ "$err" = 0 ] && [ "$ios" -gt 0 ] && [ "$wb" -gt 0 ]'
  check "the engine printed no chimera lines ($(grep -ci chimera "$d/randrw.out"))" eval '! grep -qi chimera "$d/randrw.out"'

  # 2. Where the bytes went: to the DSes, twice; not through the MDS.
  for n in mds "${DS_NODES[@]}"; do scrape $n "$d/metrics-$n-after.txt"; done
  local wsum=0 rsum=0 line="" w r
  declare -A DSW=()
  for n in "${DS_NODES[@]}"; do
    w=$(( $(ds_wr "$d/metrics-$n-after.txt") - $(ds_wr "$d/metrics-$n-before.txt") ))
    r=$(( $(ds_rd "$d/metrics-$n-after.txt") - $(ds_rd "$d/metrics-$n-before.txt") ))
    DSW[$n]=$w; wsum=$((wsum + w)); rsum=$((rsum + r))
    line+=" $n write-in=$w read-out=$r;"
  done
  local mds_in mds_out proxied granted b=$d/metrics-mds-before.txt a=$d/metrics-mds-after.txt
  mds_in=$(metric_delta "$b" "$a" chimera_rpc_received_bytes_total)
  mds_out=$(metric_delta "$b" "$a" chimera_rpc_sent_bytes_total)
  proxied=$(metric_delta "$b" "$a" chimera_pnfs_mds_io_bytes_total)
  granted=$(metric_delta "$b" "$a" chimera_pnfs_layouts_granted_total)
  echo "pnfs-test:   metrics: mds rpc-in=$mds_in rpc-out=$mds_out layouts-granted=$granted proxied=$proxied;$line fio wrote $wb, read $rb"
  declare -A SYN=()
  for n in mds "${DS_NODES[@]}"; do SYN[$n]=$(syn_count $n); done
  echo "pnfs-test:   TCP SYNs from ${ADDR[cli]}: mds ${SYN[mds]} ds1 ${SYN[ds1]} ds2 ${SYN[ds2]} ds3 ${SYN[ds3]}"
  local wmin=$((wb * mirrors * DS_BYTES_FRACTION_MIN_PCT / 100)) moved=$((wb + rb))
  local mds_max=$((moved * MDS_BYTES_FRACTION_MAX_PCT / 100))
  check "MDS metrics: layouts granted ($granted)" ge "$granted" 1
  check "DS metrics: WRITE bytes on the DSes ($wsum) >= ${DS_BYTES_FRACTION_MIN_PCT}% of fio's $wb x $mirrors mirrors" ge "$wsum" "$wmin"
  check "MDS metrics: RPC bytes received ($mds_in) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of the $moved bytes fio moved" le "$mds_in" "$mds_max"
  check "MDS metrics: RPC bytes sent ($mds_out) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of the $moved bytes fio moved" le "$mds_out" "$mds_max"
  check "MDS metrics: I/O proxied through the MDS ($proxied) <= ${MDS_BYTES_FRACTION_MAX_PCT}% of $moved" le "$proxied" "$mds_max"
  local direct=0
  for n in "${DS_NODES[@]}"; do
    if [ "${DSW[$n]}" -gt 0 ] && [ "${SYN[$n]}" -ge 1 ]; then direct=$((direct + 1)); fi
  done
  check "DS metrics: READ bytes from the DSes ($rsum) >= ${DS_BYTES_FRACTION_MIN_PCT}% of fio's $rb" \
    ge "$rsum" $((rb * DS_BYTES_FRACTION_MIN_PCT / 100))
  check "$mirrors DSes took writes, each connected from the client's address ${ADDR[cli]} ($direct)" ge "$direct" "$mirrors"

  # 3. A DS holding a mirror of the file dies (SIGKILL) under a running
  # verify job: the one that took the most of the job's writes, once it took
  # ENGINE_KILL_AT_BYTES (~1 s in here; polled, so a slower box kills as
  # early into the job, not after it).
  local kargs=(--filename=engine-kill.bin --rw=randrw --bs=4k --size=$ENGINE_KILL_BYTES --iodepth=16 --verify=crc32c)
  local victim="" best=0 fio_pid alive=0 krc=0 vrc=0
  t0=$(now_ms)
  engine_fio "$d" kill "${kargs[@]}" --do_verify=1 &
  fio_pid=$!
  while kill -0 $fio_pid 2>/dev/null && [ $(( $(now_ms) - t0 )) -lt $((ENGINE_KILL_WAIT_S_MAX * 1000)) ]; do
    sleep 0.1
    best=0; victim=""
    for n in "${DS_NODES[@]}"; do
      scrape $n "$d/metrics-$n-at-kill.txt"
      w=$(( $(ds_wr "$d/metrics-$n-at-kill.txt") - $(ds_wr "$d/metrics-$n-after.txt") ))
      if [ "$w" -gt "$best" ]; then best=$w; victim=$n; fi
    done
    [ "$best" -lt $ENGINE_KILL_AT_BYTES ] || break
  done
  if kill -0 $fio_pid 2>/dev/null; then alive=1; fi
  if [ -n "$victim" ]; then
    stop_server $victim KILL
    tl "$c: $victim (${ADDR[$victim]}, $best bytes of the job's writes so far) killed with SIGKILL $(secs_since $t0)s into fio (running: $alive)"
  else
    tl "$c: no DS had received writes of the job $(secs_since $t0)s into it: nothing killed"
  fi
  wait $fio_pid || krc=$?
  read -r err rb wb riops wiops ios < <(fio_figures "$d/kill.json")
  tl "$c: randrw verify with ${victim:-no DS} killed: fio exit $krc in $(secs_since $t0)s; error $err; read $rb bytes ($riops IOPS), wrote $wb bytes ($wiops IOPS)"
  grep -i chimera "$d/kill.out" | head -n 8 | sed 's/^/pnfs-test:   | engine: /' || true
  check "a DS holding a mirror of the file was killed while fio ran (${victim:-none}, fio running $alive)" \
    eval '[ -n "$victim" ] && [ $alive = 1 ]'
  check "fio randrw verify with ${victim:-a DS} killed exited 0 ($krc), job error 0 ($err)" \
    eval '[ "$krc" = 0 ] && [ "$err" = 0 ] && [ "$wb" -gt 0 ]'
  local after_kill=0 survivors=""
  for n in "${DS_NODES[@]}"; do
    [ "$n" = "$victim" ] && continue
    scrape $n "$d/metrics-$n-end.txt"
    w=$(( $(ds_wr "$d/metrics-$n-end.txt") - $(ds_wr "$d/metrics-$n-at-kill.txt") ))
    after_kill=$((after_kill + w)); survivors+=" $n +$w"
  done
  check "the survivors took the writes after the kill:$survivors bytes" ge "$after_kill" 1
  t0=$(now_ms)
  engine_fio "$d" verify "${kargs[@]}" --verify_only || vrc=$?
  read -r err rb wb riops wiops ios < <(fio_figures "$d/verify.json")
  tl "$c: verify-only pass: fio exit $vrc in $(secs_since $t0)s; error $err; read $rb bytes ($riops IOPS)"
  grep -i chimera "$d/verify.out" | head -n 5 | sed 's/^/pnfs-test:   | engine: /' || true
  check "verify-only pass over the file (same size and seed) with ${victim:-a DS} dead exited 0 ($vrc), job error 0 ($err), read $rb bytes" \
    eval '[ "$vrc" = 0 ] && [ "$err" = 0 ] && [ "$rb" -gt 0 ]'
  # The control: the same pass expecting md5 where crc32c was written must
  # fail verifying (the pass above could not have passed without looking).
  local crc=0
  engine_fio "$d" control "${kargs[@]}" --verify_only --verify=md5 || crc=$?
  check "control: the verify-only pass expecting md5 fails verifying (exit $crc)" \
    eval '[ "$crc" != 0 ] && grep -q "verify" "$d/control.out"'

  # The engine reported the dead DS to the MDS (LAYOUTRETURN with ff_ioerr4):
  # the MDS counts the errors against it and marks it unhealthy. Its name
  # there is config-<index in the configured list>.
  local e=$d/metrics-mds-end.txt vname="" i dserr=0 healthy=""
  scrape mds "$e"
  for i in "${!DS_NODES[@]}"; do [ "${DS_NODES[$i]}" = "$victim" ] && vname=config-$i; done
  if [ -n "$vname" ]; then
    dserr=$(metric_sum "$e" chimera_pnfs_ds_errors_total "ds=\"$vname\"")
    healthy=$(metric_sum "$e" chimera_pnfs_ds_healthy "ds=\"$vname\"")
  fi
  echo "pnfs-test:   MDS after the kill: layouts granted $(metric_delta "$a" "$e" chimera_pnfs_layouts_granted_total), returned $(metric_delta "$a" "$e" chimera_pnfs_layouts_returned_total), recalled $(metric_delta "$a" "$e" chimera_pnfs_layouts_recalled_total), layout errors $(metric_delta "$a" "$e" chimera_pnfs_layouterrors_total), I/O proxied through the MDS $(metric_delta "$a" "$e" chimera_pnfs_mds_io_bytes_total) bytes; $(grep -E '^chimera_pnfs_ds_(healthy|errors_total)' "$e" | tr '\n' ' ')"
  check "the MDS got the engine's reports on ${victim:-the dead DS} ($vname: $dserr errors, healthy $healthy)" \
    eval '[ "$dserr" -ge 1 ] && [ "$healthy" = 0 ]'
}

passed=0; failed=0
[ $guest_cases -eq 0 ] || "$guest/build-image.sh" >/dev/null
tl "run $run_dir; cases: ${cases[*]}"
"$here/topology.sh" down
"$here/topology.sh" up
"$here/topology.sh" check
tl "topology up: mds ${ADDR[mds]}, ds1 ${ADDR[ds1]}, ds2 ${ADDR[ds2]}, ds3 ${ADDR[ds3]}, cli ${ADDR[cli]} on one bridge"
for c in "${cases[@]}"; do
  if [ "$c" = engine ]; then run_engine_case "$c" || failures+=("case $c aborted")
  else run_case "$c" || failures+=("case $c aborted")
  fi
  stop_all
  if [ ${#failures[@]} -eq 0 ]; then
    passed=$((passed + 1)); tl "PASS $c"
  else
    failed=$((failed + 1)); tl "FAIL $c (${#failures[@]} checks failed; results in $run_dir/$c)"
  fi
done
tl "pNFS: $passed passed, $failed failed (cases: ${cases[*]}; results in $run_dir)"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
