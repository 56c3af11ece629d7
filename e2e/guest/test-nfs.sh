#!/usr/bin/env bash
# Kernel-client suite: boots the guest once and runs tests/nfs-workload.sh
# in it once per NFS version (tests/nfs-versions.sh drives the versions)
# against a server on the host.
#
#   test-nfs.sh chimerad CHIMERAD_BINARY   # our server (what `make test-guest` runs)
#   test-nfs.sh ganesha                    # NFS-Ganesha, to validate the harness
#
# VERSIONS (default "3 4.1 auto") picks the versions (also 4.2; auto: no
# vers= option, which must negotiate 4.2); BACKEND (memfs, the default, or
# diskfs over a file in the cache directory) chimerad's backend. Results go to
# OUT_DIR (default $CACHE/guest/results/<server>[-diskfs]): the boot's
# console-nfs-versions.log, per version nfs-workload-vers<V>.log and
# mountstats-vers<V>.txt, and nfs-versions.txt (the guest's verdicts). Prints
# one line per version and a summary; exits non-zero when any version failed
# or did not report, when none ran, or when the guest run itself failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
VERSIONS=${VERSIONS:-3 4.1 auto}
VERSION_TIMEOUT_S=600      # one version's workload in the guest, generous for a loaded 2-core box
GUEST_SLACK_S=60           # per version: the guest's clean-up after it (eth1 back, unmount)
RUN_TIMEOUT_MAX_S=3600     # run.sh's limit for one boot
CHIMERAD_NFS_PORT=22049
CHIMERAD_MNT_PORT=22048
CHIMERAD_CAPACITY_BYTES=$((512 << 20))
BACKEND=${BACKEND:-memfs}
START_WAIT_S_MAX=30

die() { echo "guest-test: ERROR: $*" >&2; exit 2; }
server=${1:-}
case "$server" in
  chimerad) [ $# -eq 2 ] || die "usage: test-nfs.sh chimerad CHIMERAD_BINARY"
            chimerad=$2; [ -x "$chimerad" ] || die "chimerad binary '$chimerad' is missing: run make build-dataplane" ;;
  ganesha) [ $# -eq 1 ] || die "usage: test-nfs.sh ganesha" ;;
  --run-versions) ;;   # internal: the loop below, called once the server is up
  *) die "usage: test-nfs.sh chimerad CHIMERAD_BINARY | ganesha" ;;
esac

# Boots the guest once and runs the workload for every version against
# NFS_PORT/MNT_PORT/EXPORT in the environment; prints a line per version and
# the summary.
run_versions() {
  local passed=0 failed=0 n=0 rc=0 seen=" " v line secs why
  for v in $VERSIONS; do
    [[ "$v" =~ ^[A-Za-z0-9.]+$ ]] || die "VERSIONS: '$v' is not a version"
    case "$seen" in *" $v "*) die "VERSIONS lists $v twice" ;; esac
    seen="$seen$v "; n=$((n + 1))
  done
  [ $n -gt 0 ] || die "VERSIONS is empty"
  # run.sh gives the test 3/4 of the boot's timeout (the rest covers the
  # boot); the versions run one after another within that.
  local per=$VERSION_TIMEOUT_S timeout_s=$(( n * (VERSION_TIMEOUT_S + GUEST_SLACK_S) * 4 / 3 ))
  if [ $timeout_s -gt $RUN_TIMEOUT_MAX_S ]; then
    timeout_s=$RUN_TIMEOUT_MAX_S; per=$(( RUN_TIMEOUT_MAX_S * 3 / 4 / n - GUEST_SLACK_S ))
  fi
  # The workload reaches the guest through the results share.
  mkdir -p "$OUT_DIR/bin"; cp "$here/tests/nfs-workload.sh" "$OUT_DIR/bin/"
  GUEST_NICS=2 "$here/run.sh" -t $timeout_s -o "$OUT_DIR" -e NFS_VERSIONS="$VERSIONS" -e NFS_VERSION_TIMEOUT_S=$per \
      -e NFS_PORT="$NFS_PORT" -e NFS_MOUNT_PORT="$MNT_PORT" -e NFS_EXPORT="$EXPORT" \
      -e NFS42_BACKEND_OPS="${NFS42_BACKEND_OPS-copy xattr}" "$here/tests/nfs-versions.sh" || rc=$?
  rm -rf "$OUT_DIR/bin"
  # The guest appends "PASS|FAIL vers=V rc=RC secs=S" per version as it ends;
  # a version without a line did not finish (the guest died or ran out of time).
  for v in $VERSIONS; do
    line=$(awk -v v="vers=$v" '$2 == v' "$OUT_DIR/nfs-versions.txt" 2>/dev/null | tail -n1)
    secs=$(sed -n 's/.* secs=\([0-9]*\).*/\1/p' <<<"$line")
    case "$line" in
      "PASS "*) passed=$((passed + 1)); echo "guest-test: PASS nfs-workload vers=$v ($SERVER_NAME, ${secs}s)" ;;
      "FAIL "*) failed=$((failed + 1))
                why=$(grep -m1 '^FAIL \[' "$OUT_DIR/nfs-workload-vers$v.log" 2>/dev/null || true)
                echo "guest-test: FAIL nfs-workload vers=$v ($SERVER_NAME, ${line#FAIL vers=$v }${why:+: $why}; log $OUT_DIR/nfs-workload-vers$v.log)" ;;
      *) failed=$((failed + 1))
         echo "guest-test: FAIL nfs-workload vers=$v ($SERVER_NAME: no result; the guest run ended with status $rc, console $OUT_DIR/console-nfs-versions.log)" ;;
    esac
  done
  if [ $rc -ne 0 ] && [ $failed -eq 0 ]; then
    echo "guest-test: FAIL the guest run ended with status $rc (console $OUT_DIR/console-nfs-versions.log)"
  fi
  echo "guest-test: $SERVER_NAME: $passed passed, $failed failed (results in $OUT_DIR)"
  [ $failed -eq 0 ] && [ $passed -gt 0 ] && [ $rc -eq 0 ]
}

if [ "$server" = --run-versions ]; then run_versions; exit; fi

# Build (or find cached) the image before any server starts.
"$here/build-image.sh" >/dev/null
suffix=""; [ "$server" = chimerad ] && [ "$BACKEND" != memfs ] && suffix="-$BACKEND"
export OUT_DIR=${OUT_DIR:-$CACHE/guest/results/$server$suffix}
rm -rf "$OUT_DIR"; mkdir -p "$OUT_DIR"

if [ "$server" = ganesha ]; then
  # Inside ganesha.sh's namespaces: QEMU's 10.0.2.2 is the namespace loopback.
  export SERVER_NAME=ganesha
  exec "$here/ganesha.sh" bash -c 'NFS_PORT=$GANESHA_NFS_PORT MNT_PORT=$GANESHA_MNT_PORT EXPORT=$GANESHA_EXPORT exec "$0" --run-versions' "$0"
fi

# chimerad on the host loopback; a config in the documented schema
# (dataplane/chimerad/CONFIG.md). Admin API and portmapper off: not under test.
# The export is named like its namespace path because NFSv4 clients walk
# chimerad's pseudo-root (whose entries are the mounts), while v3 MOUNT looks
# the export name up: one path serves both versions.
cfg_dir=$(mktemp -d "${TMPDIR:-/tmp}/chimera-guest-srv.XXXXXX")
case "$BACKEND" in
  memfs)  mounts='{ "memfs": { "module": "memfs", "path": "/", "capacity_bytes": '$CHIMERAD_CAPACITY_BYTES' } }'
          vfs=""; EXPORT=/memfs ;;
  diskfs) # O_DIRECT needs a real file system: the device lives in the cache.
          dev="$CACHE/guest/diskfs-nfs-work/dev0.img"
          rm -rf "$(dirname "$dev")"; mkdir -p "$(dirname "$dev")"; truncate -s 1G "$dev"
          mounts='{ "diskfs": { "module": "diskfs", "path": "/" } }'
          vfs=', "vfs": { "diskfs": { "config": { "initialize": true, "devices": [ { "type": "io_uring", "path": "'$dev'" } ] } } }'
          EXPORT=/diskfs
          # diskfs copies (COPY) but keeps no extended attributes (NOTSUPP).
          export NFS42_BACKEND_OPS="copy" ;;
  *) die "BACKEND=$BACKEND: expected memfs or diskfs" ;;
esac
cat >"$cfg_dir/chimerad.json" <<EOF
{
  "common":  { "log_level": "info" },
  "server":  { "role": "both", "bind": "127.0.0.1", "cores": 1,
               "nfs_port": $CHIMERAD_NFS_PORT, "mount_port": $CHIMERAD_MNT_PORT, "portmap_port": 0,
               "grace_time_s": 0 $vfs },
  "mounts":  $mounts,
  "exports": { "$EXPORT": { "path": "$EXPORT" } },
  "admin":   { "enabled": false },
  "metrics": { "enabled": false }
}
EOF
srv_pid=""
cleanup() {
  if [ -n "$srv_pid" ]; then kill "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; fi
  cp "$cfg_dir/chimerad.log" "$OUT_DIR/" 2>/dev/null || true
  rm -rf "$cfg_dir"
  if [ "$BACKEND" = diskfs ]; then rm -rf "$CACHE/guest/diskfs-nfs-work"; fi
}
trap cleanup EXIT
"$chimerad" --check-config --config "$cfg_dir/chimerad.json" >/dev/null || die "chimerad rejects the test config"
# Bounded memory: the memfs capacity bounds data; the address-space cap
# catches a leak before it hurts the shared box.
(ulimit -v $((4 << 20)); exec "$chimerad" --config "$cfg_dir/chimerad.json") >"$cfg_dir/chimerad.log" 2>&1 &
srv_pid=$!
# The ports come from chimerad's own "listening" log lines, not from whoever
# listens there: a port another process holds makes chimerad exit, and the
# run fails naming it instead of testing someone else's server. (They stay
# fixed: the separate MOUNT listener is under test and port 0 means "none"
# for it in CONFIG.md.)
read -r nfs_port mnt_port < <("$here/../../scripts/chimerad-ports.py" "$cfg_dir/chimerad.log" "$srv_pid" nfs mount --timeout $START_WAIT_S_MAX) \
  || { cat "$cfg_dir/chimerad.log" >&2; die "chimerad did not report listening on its NFS and MOUNT ports within ${START_WAIT_S_MAX}s"; }
[ "$nfs_port" = $CHIMERAD_NFS_PORT ] && [ "$mnt_port" = $CHIMERAD_MNT_PORT ] \
  || die "chimerad reports NFS $nfs_port / MOUNT $mnt_port, want $CHIMERAD_NFS_PORT / $CHIMERAD_MNT_PORT"
SERVER_NAME=chimerad-$BACKEND NFS_PORT=$CHIMERAD_NFS_PORT MNT_PORT=$CHIMERAD_MNT_PORT EXPORT=$EXPORT run_versions
