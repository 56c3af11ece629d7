#!/usr/bin/env bash
# chimera-fuse on this host (make test-fuse): chimerad on 127.0.0.1 (ports it
# picks, read back from its log), chimera-fuse mounted over it, a file
# workload through the mount, hostile cases (nothing listening, a wrong
# export, the server killed while mounted), the --fuse-fd mode, the
# --sidecar-dir hand-over (a stand-in for the CSI node plugin), and recovery:
# chimerad on diskfs killed -9 and restarted on the same port and device in
# the middle of a large write, which must end without an error and with the
# right checksum. Each check prints PASS/FAIL; exits non-zero on a failure or
# when nothing ran. Needs root and /dev/fuse.
#
# usage: test-fuse.sh CHIMERAD CHIMERA_FUSE
set -uo pipefail

chimerad=$1
fusebin=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
for f in "$chimerad" "$fusebin"; do [ -x "$f" ] || { echo "test-fuse: $f is missing" >&2; exit 2; }; done
if [ ! -c /dev/fuse ] || [ "$(id -u)" != 0 ]; then
  echo "test-fuse: FAIL needs root and /dev/fuse on this host (not run in the QEMU guest yet)" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/chimera-fuse.XXXXXX")
mnt=$work/mnt
mkdir -p "$mnt"
srv=""
fpid=""
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "test-fuse: PASS $*"; }
bad() { failed=$((failed + 1)); echo "test-fuse: FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

mounted() { grep -q " $1 fuse" /proc/self/mounts; }
stop_fuse() {
  if [ -n "$fpid" ]; then
    kill -TERM "$fpid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$fpid" 2>/dev/null
    wait "$fpid" 2>/dev/null
    fpid=""
  fi
  mounted "$mnt" && umount -l "$mnt" 2>/dev/null
  return 0
}
stop_srv() {
  if [ -n "$srv" ]; then kill -KILL "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; srv=""; fi
}
cleanup() {
  stop_fuse
  stop_srv
  rm -rf "$work"
}
trap cleanup EXIT

# start_server CONFIG LOG: chimerad in the background ($srv), its NFS port in $port.
start_server() {
  (exec "$chimerad" --config "$1") >>"$2" 2>&1 &
  srv=$!
  read -r port < <("$repo/scripts/chimerad-ports.py" "$2" "$srv" nfs --timeout 30) ||
    { tail -20 "$2" >&2; echo "test-fuse: chimerad did not report its NFS port" >&2; exit 1; }
}

# mount_fuse ARGS...: chimera-fuse in the foreground ($fpid), waits for the mount.
mount_fuse() {
  "$fusebin" --server "127.0.0.1:$port" --export "$export" --foreground "$@" "$mnt" >>"$work/fuse.log" 2>&1 &
  fpid=$!
  for _ in $(seq 100); do mounted "$mnt" && return 0; kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
  tail -5 "$work/fuse.log" >&2
  return 1
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
sha() { timeout 60 sha256sum "$1" | cut -d' ' -f1; }
T="timeout 30"

memfs_conf=$work/memfs.json
cat >"$memfs_conf" <<EOF
{ "common": { "log_level": "info" },
  "server": { "bind": "127.0.0.1", "cores": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
  "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 1073741824 } },
  "exports": { "/memfs": { "path": "/memfs" } },
  "admin": { "enabled": false }, "metrics": { "enabled": false } }
EOF
start_server "$memfs_conf" "$work/memfs.log"
export=/memfs

# --- the file workload -------------------------------------------------------
if mount_fuse --attr-timeout-ms 1000 --entry-timeout-ms 1000; then ok "mount 127.0.0.1:$port:/memfs"; else bad "mount"; exit 1; fi
head -c $((64 << 20)) /dev/urandom >"$work/big"
want=$(sha "$work/big")
check "write 64 MiB (cp)" $T cp "$work/big" "$mnt/big"
drop_caches
check "sha256 of 64 MiB after dropping the page cache" [ "$(sha "$mnt/big")" = "$want" ]
check "cp of a file inside the mount" bash -c "$T cp '$mnt/big' '$mnt/big2' && $T cmp -s '$work/big' '$mnt/big2'"
check "fsync (dd conv=fsync)" $T dd if="$work/big" of="$mnt/synced" bs=1M count=8 conv=fsync status=none

mkdir "$mnt/many"
(cd "$mnt/many" && for i in $(seq 1000); do : >"f$i" || exit 1; done)
check "readdir of 1000 entries" [ "$($T ls -f "$mnt/many" | grep -c '^f')" = 1000 ]
check "readdir with attributes (ls -l, 1000 entries)" [ "$($T ls -l "$mnt/many" | grep -c ' f[0-9]')" = 1000 ]

check "mkdir" bash -c "mkdir '$mnt/d' && [ -d '$mnt/d' ]"
echo x >"$mnt/d/x"
check "rmdir of a non-empty directory fails (ENOTEMPTY)" bash -c "! rmdir '$mnt/d' 2>$work/err && grep -q 'not empty' $work/err"
check "rmdir" bash -c "rm '$mnt/d/x' && rmdir '$mnt/d' && [ ! -e '$mnt/d' ]"

echo renamed >"$mnt/r1"
mkdir "$mnt/rd"
check "rename across directories" bash -c "mv '$mnt/r1' '$mnt/rd/r2' && [ ! -e '$mnt/r1' ] && [ \"\$(cat '$mnt/rd/r2')\" = renamed ]"
echo over >"$mnt/r3"
check "rename over an existing file" bash -c "mv -f '$mnt/r3' '$mnt/rd/r2' && [ \"\$(cat '$mnt/rd/r2')\" = over ]"

echo l >"$mnt/l1"
check "link: count 2, same inode" bash -c "ln '$mnt/l1' '$mnt/l2' && [ \"\$(stat -c %h '$mnt/l1')\" = 2 ] && [ \"\$(stat -c %i '$mnt/l1')\" = \"\$(stat -c %i '$mnt/l2')\" ]"
check "unlink of one link: count 1" bash -c "rm '$mnt/l2' && sleep 1.1 && [ \"\$(stat -c %h '$mnt/l1')\" = 1 ]"
check "symlink / readlink" bash -c "ln -s some/where '$mnt/sl' && [ \"\$(readlink '$mnt/sl')\" = some/where ] && [ -L '$mnt/sl' ]"
check "symlink followed" bash -c "ln -s l1 '$mnt/sl2' && [ \"\$(cat '$mnt/sl2')\" = l ]"

echo mode >"$mnt/m"
check "chmod" bash -c "chmod 640 '$mnt/m' && [ \"\$(stat -c %a '$mnt/m')\" = 640 ]"
check "chown (root)" bash -c "chown 1234:5678 '$mnt/m' && [ \"\$(stat -c %u:%g '$mnt/m')\" = 1234:5678 ]"
head -c 100000 /dev/urandom >"$mnt/t"
check "truncate down" bash -c "truncate -s 1000 '$mnt/t' && [ \"\$(stat -c %s '$mnt/t')\" = 1000 ] && [ \"\$(wc -c <'$mnt/t')\" = 1000 ]"
check "truncate up reads zeroes" bash -c "truncate -s 5000 '$mnt/t' && [ \"\$(tail -c 4000 '$mnt/t' | tr -d '\\0' | wc -c)\" = 0 ]"
check "timestamps (touch -d)" bash -c "touch -d '2001-02-03 04:05:06 UTC' '$mnt/t' && [ \"\$(stat -c %Y '$mnt/t')\" = 981173106 ]"
check "atime (touch -a -d)" bash -c "touch -a -d '2002-02-03 04:05:06 UTC' '$mnt/t' && [ \"\$(stat -c %X '$mnt/t')\" = 1012709106 ]"
check "unlink" bash -c "rm '$mnt/t' && [ ! -e '$mnt/t' ]"
check "open of a missing file: ENOENT" bash -c "! cat '$mnt/nope' 2>$work/err && grep -q 'No such file' $work/err"
check "df (statfs): 1 GiB export" bash -c "s=\$(stat -f -c '%b*%S' '$mnt'); [ \$((s)) -ge \$((900 << 20)) ] && [ \$((s)) -le \$((1100 << 20)) ] && df '$mnt' >/dev/null"

# A remount: nothing cached in the kernel, the data comes from the server.
stop_fuse
check "SIGTERM: clean unmount" bash -c "! grep -q ' $mnt fuse' /proc/self/mounts"
if mount_fuse --writeback; then ok "remount with --writeback"; else bad "remount with --writeback"; fi
check "sha256 after the remount" [ "$(sha "$mnt/big")" = "$want" ]
check "writeback: write 64 MiB" $T cp "$work/big" "$mnt/wb"
drop_caches
check "writeback: sha256 after dropping the cache" [ "$(sha "$mnt/wb")" = "$want" ]
check "external umount ends chimera-fuse" bash -c "timeout 20 umount '$mnt' 2>$work/err || { cat $work/err; exit 1; }; for i in \$(seq 100); do kill -0 $fpid 2>/dev/null || exit 0; sleep 0.1; done; echo 'still running 10 s after umount'; exit 1"
wait "$fpid" 2>/dev/null
fpid=""

# --- --fuse-fd: someone else opens /dev/fuse and mounts it -----------------
python3 - "$fusebin" "$port" "$mnt" "$work/fuse.log" "$work/big" <<'PY' && ok "--fuse-fd: served a descriptor mounted by another process" || bad "--fuse-fd"
import ctypes, os, subprocess, sys, time
fusebin, port, mnt, log, big = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/fuse", os.O_RDWR)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions".encode()
if libc.mount(b"chimera", mnt.encode(), b"fuse.chimera", 0, opts) != 0:
    sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")
with open(log, "a") as lf:
    p = subprocess.Popen([fusebin, "--server", f"127.0.0.1:{port}", "--export", "/memfs", "--fuse-fd", str(fd)],
                         pass_fds=[fd], stderr=lf)
os.close(fd)
try:
    with open(os.path.join(mnt, "big"), "rb") as a, open(big, "rb") as b:
        good = a.read() == b.read()
finally:
    libc.umount2(mnt.encode(), 2)  # MNT_DETACH
    p.terminate()
    p.wait(timeout=10)
sys.exit(0 if good else "data differs through --fuse-fd")
PY

# --- --sidecar-dir: the CSI node plugin's hand-over (mountMode: sidecar) ----
# A stand-in for the node plugin opens /dev/fuse, mounts it and listens on
# DIR/<name>/socket; the sidecar (no --server, no mount of its own) connects,
# takes the JSON + descriptor and serves it. Bad hand-overs are logged naming
# their socket and skipped while the good volumes keep working; SIGTERM ends
# the sidecar with 0 and leaves the mounts to their owner. Each line the
# stand-in prints is "ok|..." or "bad|...".
python3 - "$fusebin" "$port" "$work" >"$work/sidecar.out" 2>&1 <<'PY'
import ctypes, hashlib, json, os, signal, socket, subprocess, sys, time
fusebin, port, work = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
sdir, log = f"{work}/sidecar", f"{work}/sidecar.log"
os.makedirs(sdir)
def report(good, what): print(("ok|" if good else "bad|") + what, flush=True)
def mount_fuse_fd(mnt):
    os.makedirs(mnt, exist_ok=True)
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions".encode()
    if libc.mount(b"chimera-fuse", mnt.encode(), b"fuse.chimera-fuse", 6, opts) != 0:  # MS_NOSUID|MS_NODEV
        sys.exit(f"mount {mnt}: {os.strerror(ctypes.get_errno())}")
    return fd
def hand_over(name, body, fd):
    os.makedirs(f"{sdir}/{name}")
    path = f"{sdir}/{name}/socket"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(10)
    try:
        c, _ = srv.accept()
        socket.send_fds(c, [body], [fd] if fd is not None else [])
        c.close()
        return True
    except socket.timeout:
        return False
    finally:
        srv.close()
        os.unlink(path)
def msg(**kw): return json.dumps({"server": f"127.0.0.1:{port}", "export": "/memfs", **kw}).encode()
def write_read(mnt, name, n):
    data = os.urandom(n)
    with open(f"{mnt}/{name}", "wb") as f:
        f.write(data)
    with open(f"{mnt}/{name}", "rb") as f:
        return f.read() == data, hashlib.sha256(data).hexdigest()
def logged(sock, says):
    for _ in range(50):
        if any(sock in l and says in l for l in open(log)):
            return True
        time.sleep(0.1)
    return False

p = subprocess.Popen([fusebin, "--sidecar-dir", sdir], stderr=open(log, "a"))
mounts = []
try:
    m1 = f"{work}/sc1"
    fd = mount_fuse_fd(m1); mounts.append(m1)
    report(hand_over("v1", msg(uid=0, gid=0, attrTimeoutMs=500, volumeId="v1"), fd), "sidecar: v1 taken from its socket")
    os.close(fd)
    good, digest = write_read(m1, "sc-v1", 16 << 20)
    report(good, "sidecar: 16 MiB written and read back through v1")
    open(f"{work}/sc-v1.sha", "w").write(digest)

    # Hostile hand-overs, each on its own socket: not JSON, no descriptor,
    # a descriptor that is not /dev/fuse.
    mb = f"{work}/scbad"
    fd = mount_fuse_fd(mb); mounts.append(mb)
    hand_over("bad-json", b"{not json", fd); os.close(fd)
    report(logged("bad-json/socket", "bad volume message"), "sidecar: a malformed message is refused naming its socket")
    hand_over("no-fd", msg(), None)
    report(logged("no-fd/socket", "carried 0 file descriptors"), "sidecar: a message without a descriptor is refused naming its socket")
    with open("/dev/null") as null:
        hand_over("not-fuse", msg(), null.fileno())
    report(logged("not-fuse/socket", "not /dev/fuse"), "sidecar: a descriptor that is not /dev/fuse is refused naming its socket")
    report(p.poll() is None, "sidecar: still running after the bad hand-overs")
    good, _ = write_read(m1, "sc-v1-again", 1 << 20)
    report(good, "sidecar: v1 still serves after the bad hand-overs")

    m2 = f"{work}/sc2"
    fd = mount_fuse_fd(m2); mounts.append(m2)
    report(hand_over("v2", msg(writeback=True), fd), "sidecar: v2 taken from its socket")
    os.close(fd)
    good, _ = write_read(m2, "sc-v2", 4 << 20)
    report(good and os.path.exists(f"{m2}/sc-v1"), "sidecar: a second volume serves the same export (sees v1's file)")

    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        rc = "still running 5 s after SIGTERM"
    report(rc == 0, f"sidecar: SIGTERM ends it with 0 (rc {rc}, {time.monotonic() - t:.1f} s)")
    still = open("/proc/self/mounts").read()
    report(all(f" {m} fuse" in still for m in (m1, m2)), "sidecar: the mounts are left to the node plugin")
finally:
    if p.poll() is None:
        p.kill()
    for m in mounts:
        libc.umount2(m.encode(), 2)  # MNT_DETACH
PY
rc=$?
while IFS='|' read -r verdict what; do
  case $verdict in ok) ok "$what" ;; bad) bad "$what" ;; *) echo "test-fuse:   $verdict $what" ;; esac
done <"$work/sidecar.out"
[ $rc -eq 0 ] || { bad "sidecar stand-in exited $rc"; tail -5 "$work/sidecar.log" >&2; }
# What v1 wrote reached chimerad: read it back through a mount of our own.
if [ -f "$work/sc-v1.sha" ] && mount_fuse; then
  drop_caches
  check "sidecar: v1's file verifies through another client of chimerad" [ "$(sha "$mnt/sc-v1")" = "$(cat "$work/sc-v1.sha")" ]
  stop_fuse
else
  bad "sidecar: v1's file not checked through another client"
fi

# --- the inode table is bounded; forget frees its entries -----------------
if mount_fuse --max-inodes 100; then
  (cd "$mnt/many" && timeout 60 stat -- f* >/dev/null 2>"$work/err")
  n=$(grep -c 'Too many open files in system' "$work/err")
  check "--max-inodes 100: stat of 1000 files fails past the bound with ENFILE ($n failed)" bash -c "[ $n -ge 800 ] && kill -0 $fpid"
  echo 2 >/proc/sys/vm/drop_caches
  sleep 1
  check "--max-inodes 100: after the kernel forgets, lookups work again" bash -c "cd '$mnt/many' && timeout 30 stat -- f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 >/dev/null"
  stop_fuse
else
  bad "mount with --max-inodes"
fi

# --- hostile --------------------------------------------------------------
free=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 30 "$fusebin" --server "127.0.0.1:$free" --export /memfs "$mnt" >"$work/out" 2>&1
rc=$?
check "nothing listening: exits non-zero naming the address (rc $rc: $(head -c 120 "$work/out"))" bash -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q '127.0.0.1:$free' '$work/out' && ! grep -q ' $mnt fuse' /proc/self/mounts"
timeout 30 "$fusebin" --server "127.0.0.1:$port" --export /no-such-export "$mnt" >"$work/out" 2>&1
rc=$?
check "wrong export: exits non-zero naming it (rc $rc: $(head -c 120 "$work/out"))" bash -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q '/no-such-export' '$work/out' && grep -q MNT3ERR '$work/out'"

mount_fuse --reconnect-timeout-ms 2000 || bad "mount before the server is killed"
echo alive >"$mnt/alive"
stop_srv
t0=$(date +%s)
timeout 60 cat "$mnt/big" >/dev/null 2>"$work/err"
rc=$?
check "server killed: read fails with EIO, not a hang (rc $rc, $(($(date +%s) - t0)) s)" bash -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'Input/output error' '$work/err'"
t0=$(date +%s)
timeout 60 stat "$mnt/alive2" >/dev/null 2>"$work/err"
rc=$?
check "server down: the next operation fails fast with EIO (rc $rc, $(($(date +%s) - t0)) s)" bash -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(($(date +%s) - t0)) -le 10 ] && grep -q 'Input/output error' '$work/err'"
fp=$fpid
stop_fuse
check "server down: SIGTERM still unmounts and chimera-fuse exits" bash -c "! grep -q ' $mnt fuse' /proc/self/mounts && ! kill -0 $fp 2>/dev/null"

# --- recovery: chimerad on diskfs restarted in the middle of a write ------
truncate -s 2G "$work/disk.img"
disk_conf=$work/disk.json
write_disk_conf() {
  cat >"$disk_conf" <<EOF
{ "common": { "log_level": "info" },
  "server": { "bind": "127.0.0.1", "cores": 1, "nfs_port": $1, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0,
              "vfs": { "diskfs": { "config": { "initialize": true, "devices": [ { "type": "io_uring", "path": "$work/disk.img" } ] } } } },
  "mounts": { "d": { "module": "diskfs", "path": "/" } },
  "exports": { "/d": { "path": "/d" } },
  "admin": { "enabled": false }, "metrics": { "enabled": false } }
EOF
}
write_disk_conf 0
start_server "$disk_conf" "$work/disk.log"
export=/d
head -c $((192 << 20)) /dev/urandom >"$work/rec"
want=$(sha "$work/rec")
if mount_fuse --reconnect-timeout-ms 60000; then
  # 1 MiB writes, paced so the kill lands between two of chimera-fuse's
  # COMMITs (one per 32 MiB): unstable writes are then lost by the restart
  # and must be resent. fsync before close; any error fails the writer.
  timeout 150 python3 - "$work/rec" "$mnt/rec" 2>"$work/dd.err" <<'PY' &
import os, sys, time
src, dst = sys.argv[1:]
with open(src, "rb") as s, open(dst, "wb", buffering=0) as d:
    while True:
        b = s.read(1 << 20)
        if not b:
            break
        d.write(b)
        time.sleep(0.004)
    os.fsync(d.fileno())
PY
  dd=$!
  for _ in $(seq 600); do
    s=$(stat -c %s "$mnt/rec" 2>/dev/null || echo 0)
    [ "$s" -ge $((72 << 20)) ] && break
    sleep 0.02
  done
  echo "test-fuse: killing chimerad (diskfs) with $((s >> 20)) MiB written"
  stop_srv
  sleep 1
  write_disk_conf "$port"
  start_server "$disk_conf" "$work/disk.log"
  wait "$dd"
  rc=$?
  check "diskfs restart mid-write: the writer sees no error (rc $rc $(head -c 100 "$work/dd.err"))" [ $rc -eq 0 ]
  drop_caches
  check "diskfs restart mid-write: sha256 matches" [ "$(sha "$mnt/rec")" = "$want" ]
  check "diskfs restart mid-write: chimera-fuse reconnected" grep -q reconnected "$work/fuse.log"
  check "diskfs restart mid-write: the new verifier was seen and the held writes resent" grep -q 'verifier changed: resending' "$work/fuse.log"
  grep -E 'verifier changed|reconnected' "$work/fuse.log" | sed 's/^/test-fuse:   log: /' | head -5
  stop_fuse
else
  bad "mount of the diskfs export"
fi

total=$((passed + failed))
echo "test-fuse: $passed passed, $failed failed"
[ "$total" -gt 0 ] && [ "$failed" -eq 0 ]
