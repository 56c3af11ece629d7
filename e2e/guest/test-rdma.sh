#!/usr/bin/env bash
# NFS over RDMA in the QEMU guest (issue 15): chimerad runs inside the guest
# on soft RoCE (rdma_rxe), the kernel client mounts it with proto=rdma; the
# guest side is tests/nfs-rdma.sh.
#
#   test-rdma.sh CHIMERAD CHIMERA_RDMA_PROBE FIO_ENGINE_SO FIO CHIMERA_FUSE
#
# FIO is the fio the engine was built against (e2e/peers/fio-libnfs.sh); it
# reaches the guest with the libraries it links beyond glibc (the guest's
# glibc is the same release), so the engine's ABI is the one it expects.
#
# NFS_DATA_MIB (default 64): the workload's data set. Results (mountstats,
# metrics, figures, logs) in $CACHE/guest/results/rdma/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
RUN_TIMEOUT_S=1500

die() { echo "guest-rdma: ERROR: $*" >&2; exit 2; }
[ $# -eq 5 ] || die "usage: test-rdma.sh CHIMERAD CHIMERA_RDMA_PROBE FIO_ENGINE_SO FIO CHIMERA_FUSE"
for b in "$1" "$2" "$4" "$5"; do [ -x "$b" ] || die "'$b' is missing: run make build-dataplane build-rdma build-fio-engine build-fuse"; done
[ -f "$3" ] || die "'$3' is missing: run make build-fio-engine"

"$here/build-image.sh" >/dev/null
OUT_DIR=$CACHE/guest/results/rdma
rm -rf "$OUT_DIR"; mkdir -p "$OUT_DIR/bin"
cp "$1" "$2" "$3" "$5" "$here/tests/nfs-workload.sh" "$OUT_DIR/bin/"
mkdir -p "$OUT_DIR/bin/peer"
cp "$4" "$OUT_DIR/bin/peer/fio"
ldd "$4" | awk '$3 ~ /^\// { print $3 }' | while read -r lib; do
  case "$(basename "$lib")" in libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;; *) cp -L "$lib" "$OUT_DIR/bin/peer/" ;; esac
done
trap 'rm -rf "$OUT_DIR/bin"' EXIT

rc=0
GUEST_MEM_MB=2048 "$here/run.sh" -t $RUN_TIMEOUT_S -o "$OUT_DIR" -e NFS_DATA_MIB="${NFS_DATA_MIB:-64}" \
  "$here/tests/nfs-rdma.sh" || rc=$?
if [ $rc -ne 0 ]; then
  echo "guest-rdma: FAIL (guest rc $rc; console $OUT_DIR/console-nfs-rdma.log)"
  exit 1
fi
echo "guest-rdma: figures (soft RoCE under emulation: recorded, not gated)"
sed 's/^/  /' "$OUT_DIR/rdma-figures.txt"
echo "guest-rdma: PASS"
