#!/usr/bin/env bash
# The userspace NVMe driver in the QEMU guest (issue 14): q35 with the
# emulated intel-iommu and three emulated NVMe controllers (two with a
# namespace on an image file, one without), the guest side in
# tests/nvme-vfio.sh. Afterwards the host checks the two images with
# chimera-fsck over io_uring: the file system chimerad wrote through vfio
# reads clean through the kernel's block path too.
#
#   test-vfio.sh CHIMERAD CHIMERA_NVME_CHECK CHIMERA_FSCK DISKFS_CRASH_TEST
#
# DISKFS_CRASH_TEST is diskfs's crash-state test binary (make build-nvme):
# the guest runs it on an 8 MiB namespace (controller C) through vfio and
# through io_uring.
#
# NVME_MIB (default 256): size of each namespace. Results (identify,
# exercise, bench figures, metrics, logs) in $CACHE/guest/results/vfio/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
NVME_MIB=${NVME_MIB:-256}
RUN_TIMEOUT_S=1800

die() { echo "guest-vfio: ERROR: $*" >&2; exit 2; }
[ $# -eq 4 ] || die "usage: test-vfio.sh CHIMERAD CHIMERA_NVME_CHECK CHIMERA_FSCK DISKFS_CRASH_TEST"
for b in "$@"; do [ -x "$b" ] || die "binary '$b' is missing: run make build-dataplane build-nvme"; done
chimerad=$1; check=$2; fsck=$3

"$here/build-image.sh" >/dev/null
OUT_DIR=$CACHE/guest/results/vfio
rm -rf "$OUT_DIR"; mkdir -p "$OUT_DIR/bin"
cp "$chimerad" "$check" "$fsck" "$here/tests/nfs-workload.sh" "$OUT_DIR/bin/"
cp "$4" "$OUT_DIR/bin/diskfs-crash-test"
work=$CACHE/guest/vfio-work
rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work" "$OUT_DIR/bin"' EXIT
for n in A B; do truncate -s "${NVME_MIB}M" "$work/nvme$n.img"; done
truncate -s 8M "$work/nvmeC.img"

rc=0
GUEST_IOMMU=1 GUEST_MEM_MB=4096 GUEST_KERNEL_ARGS="hugepagesz=1G hugepages=1" "$here/run.sh" -t $RUN_TIMEOUT_S -o "$OUT_DIR" -e NVME_BYTES=$((NVME_MIB << 20)) \
  "$here/tests/nvme-vfio.sh" \
  -drive "file=$work/nvmeA.img,if=none,format=raw,id=nvA" -device nvme,serial=chimA,drive=nvA \
  -drive "file=$work/nvmeB.img,if=none,format=raw,id=nvB" -device nvme,serial=chimB,drive=nvB \
  -drive "file=$work/nvmeC.img,if=none,format=raw,id=nvC" -device nvme,serial=chimC,drive=nvC \
  -device nvme,serial=chimE || rc=$?
if [ $rc -ne 0 ]; then
  echo "guest-vfio: FAIL (guest rc $rc; console $OUT_DIR/console-nvme-vfio.log)"
  exit 1
fi
# The same file system through io_uring on the host, on both images.
if ! "$fsck" "$work/nvmeA.img" "$work/nvmeB.img" >"$OUT_DIR/host-fsck.txt" 2>&1; then
  cat "$OUT_DIR/host-fsck.txt"
  echo "guest-vfio: FAIL chimera-fsck over io_uring on the images the guest wrote through vfio"
  exit 1
fi
echo "guest-vfio: host chimera-fsck (io_uring) on both images: $(tail -n 1 "$OUT_DIR/host-fsck.txt")"
echo "guest-vfio: figures (emulated controller, recorded, not gated):"
sed 's/^/  /' "$OUT_DIR/vfio-bench.txt"
echo "guest-vfio: PASS (results in $OUT_DIR)"
