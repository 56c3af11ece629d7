#!/usr/bin/env bash
# Proves the peer tooling works on this machine, end to end:
#   - fio-libnfs.sh yields a fio that has the libnfs engine;
#   - ganesha.sh starts Ganesha confined to its namespace (its sockets are in the
#     namespace, not on the host), is idempotent, and serves both exports: data
#     written through /vfs reads back verified (crc32c), /mem accepts I/O;
#   - a config Ganesha rejects fails start at once with Ganesha's own message;
#   - stop removes the server and the namespace, and is idempotent.
# Uses its own namespace name, so it does not disturb a running `make bench`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GANESHA_NETNS=chimera-peers-test
export GANESHA_STATE="${TMPDIR:-/tmp}/chimera-peers-test-$$"
# Ports other than the defaults: proves the settings reach Ganesha and the client.
export GANESHA_NFS_PORT=12049 GANESHA_MNT_PORT=12048
pass=0
fail() { echo "FAIL: $*" >&2; "$here/ganesha.sh" stop >/dev/null 2>&1 || true; rm -rf "$GANESHA_STATE"; exit 1; }
ok() { echo "ok: $*"; pass=$((pass + 1)); }
trap '"$here/ganesha.sh" stop >/dev/null 2>&1 || true; rm -rf "$GANESHA_STATE"' EXIT

fio="$("$here/fio-libnfs.sh")"
"$fio" --enghelp | grep -Eq '^[[:space:]]+nfs$' || fail "$fio lacks the nfs (libnfs) engine"
ok "fio with the libnfs engine: $fio"

"$here/ganesha.sh" start >/dev/null || fail "ganesha.sh start"
pid1="$("$here/ganesha.sh" status | sed -n 's/.*pid=\([0-9]*\).*/\1/p')"
[ -n "$pid1" ] || fail "status does not report a pid"
"$here/ganesha.sh" start >/dev/null 2>&1 || fail "second start"
pid2="$("$here/ganesha.sh" status | sed -n 's/.*pid=\([0-9]*\).*/\1/p')"
[ "$pid1" = "$pid2" ] || fail "second start replaced the server ($pid1 -> $pid2)"
ok "start is idempotent (pid $pid1)"

ip netns exec "$GANESHA_NETNS" ss -ltnp | grep -q ":$GANESHA_NFS_PORT .*ganesha" ||
  fail "ganesha does not listen on $GANESHA_NFS_PORT inside $GANESHA_NETNS"
if ss -ltnp | grep -q "pid=$pid1,"; then fail "ganesha (pid $pid1) has a listening socket on the host"; fi
ok "listening only inside netns $GANESHA_NETNS"

url() { echo "nfs://127.0.0.1/$1?nfsport=$GANESHA_NFS_PORT&mountport=$GANESHA_MNT_PORT"; }
out="$(ip netns exec "$GANESHA_NETNS" timeout 120 "$fio" --name=verify --ioengine=nfs --nfs_url="$(url vfs)" \
  --filename=verify.0 --rw=write --bs=64k --size=8m --verify=crc32c --do_verify=1 2>&1)" ||
  fail "fio write+verify on /vfs: $out"
grep -q 'err= 0' <<<"$out" || fail "fio on /vfs reported an error: $out"
ok "/vfs: 8 MiB written and verified (crc32c)"
out="$(ip netns exec "$GANESHA_NETNS" timeout 120 "$fio" --name=mem --ioengine=nfs --nfs_url="$(url mem)" \
  --filename=mem.0 --rw=write --bs=64k --size=8m 2>&1)" || fail "fio write on /mem: $out"
ok "/mem: 8 MiB written"

"$here/ganesha.sh" stop >/dev/null 2>&1 || fail "stop"
if "$here/ganesha.sh" status >/dev/null; then fail "status says running after stop"; fi
if ip netns list | awk '{print $1}' | grep -qx "$GANESHA_NETNS"; then fail "netns $GANESHA_NETNS left behind"; fi
kill -0 "$pid1" 2>/dev/null && [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = ganesha.nfsd ] && fail "ganesha $pid1 still running"
"$here/ganesha.sh" stop >/dev/null 2>&1 || fail "second stop"
ok "stop removes server and namespace, and is idempotent"

t0=$SECONDS
if msg="$(GANESHA_MEM_INODE_BYTES=4194304 "$here/ganesha.sh" start 2>&1)"; then fail "start with an out-of-range Inode_Size succeeded"; fi
grep -q 'is out of range' <<<"$msg" || fail "start failure does not carry Ganesha's message: $msg"
[ $((SECONDS - t0)) -lt 30 ] || fail "a rejected config took $((SECONDS - t0))s to report"
if ip netns list | awk '{print $1}' | grep -qx "$GANESHA_NETNS"; then fail "netns left behind after a failed start"; fi
ok "a config Ganesha rejects fails start at once, naming the problem"

echo "test-peers: $pass checks passed"
