#!/bin/sh
# Guest self-test: proves the image boots to a test, its tools and their
# libraries load, the NFS/RDMA modules load, the host is reachable at 10.0.2.2
# (GUEST_PROBE_PORT, a TCP port run.sh's caller listens on, when given) and
# files written to /results reach the host. Any failure names the check.
set -u
fail() { echo "FAIL [smoke] $*"; exit 1; }
for t in mount.nfs ip rdma ibv_devices fio flock lockhelper lspci modprobe; do
  command -v "$t" >/dev/null || fail "tool $t missing"
done
fio --version || fail "fio does not start (library missing?)"
ip -V || fail "ip (iproute2) does not start"
flock --version >/dev/null 2>&1 || fail "flock does not start"
for m in nfsv3 nfsv4 rpcrdma rdma_rxe ib_uverbs rdma_ucm; do
  modprobe "$m" || fail "modprobe $m"
done
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
ibv_devices | grep -q rxe0 || fail "ibv_devices does not list rxe0"
if [ -n "${GUEST_PROBE_PORT:-}" ]; then
  echo ping | nc -w 5 10.0.2.2 "$GUEST_PROBE_PORT" || fail "cannot reach host port $GUEST_PROBE_PORT at 10.0.2.2"
fi
[ -d /results ] && echo "smoke-ok" >/results/smoke.txt || fail "cannot write /results"
echo "PASS smoke"
