#!/usr/bin/env bash
# Boot the test guest on one test script and report whether it passed.
#
#   run.sh [-e KEY=VALUE]... [-o OUT_DIR] [-t TIMEOUT_S] TEST_SCRIPT [extra qemu args...]
#
# The script is packed as a second zstd cpio behind the cached base initramfs
# (build-image.sh) and run by the guest's /init with the -e variables in its
# environment. The guest reaches the host's 127.0.0.1 as 10.0.2.2 (QEMU user
# networking). OUT_DIR is shared with the guest as /results (virtio-9p): the way
# files come back to the host. The guest's exit status never reaches QEMU, so
# the verdict comes from markers the guest prints on the serial console, tagged
# with a per-run nonce so test output cannot forge them. A boot that never
# reaches the test (about 1 boot in 13 on TCG prints nothing) is retried once.
#
# Exit status: the test's own status when it ran; 124 when it started but did
# not finish in time; 125 when the guest never started the test (twice).
# Environment: GUEST_MEM_MB (default 1024), GUEST_SMP (2), GUEST_NICS (1 or 2),
# GUEST_IOMMU (0 or 1: the emulated intel-iommu for VFIO), GUEST_NETDEV_OPTS
# (appended to the user netdev, e.g. ",hostfwd=tcp:127.0.0.1:10250-:10250"),
# GUEST_KERNEL_ARGS (appended to the kernel command line, e.g.
# "hugepagesz=1G hugepages=1": 1 GiB pages can only be reserved at boot).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
TIMEOUT_MAX_S=3600   # no single guest run may hold the shared box longer
RETRY_BOOTS_MAX=2    # first boot + one retry when the test never started

die() { echo "guest-run: ERROR: $*" >&2; exit 2; }
usage() { die "usage: run.sh [-e KEY=VALUE]... [-o OUT_DIR] [-t TIMEOUT_S] TEST_SCRIPT [qemu args...]"; }

envs=()
out_dir=""
timeout_s=600
while [ $# -gt 0 ]; do
  case "$1" in
    -e) [ $# -ge 2 ] || usage
        [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || die "-e wants KEY=VALUE with a shell identifier as KEY, got '$2'"
        envs+=("$2"); shift 2 ;;
    -o) [ $# -ge 2 ] || usage; out_dir=$2; shift 2 ;;
    -t) [ $# -ge 2 ] || usage
        [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 10 ] && [ "$2" -le $TIMEOUT_MAX_S ] \
          || die "-t wants whole seconds in 10..$TIMEOUT_MAX_S, got '$2'"
        timeout_s=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) die "unknown option '$1'" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
test_script=$1; shift
[ -f "$test_script" ] || die "test script '$test_script' does not exist"
name=$(basename "$test_script" .sh)

img=$("$here/build-image.sh" | tail -n1)
[ -s "$img/initrd.img" ] || die "guest image build failed"

work=$(mktemp -d "${TMPDIR:-/tmp}/chimera-guest.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -z "$out_dir" ]; then out_dir=$work/results; fi
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)

nonce=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
# The test's environment, quoted for busybox sh: 'it'\''s' style.
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
mkdir -p "$work/tree/test"
{
  echo "GUEST_NONCE=$(sq "$nonce")"
  # The guest-side watchdog (counted from the test start, after a boot that
  # took up to ~110 s on a loaded host) fires well before ours so its markers
  # get out.
  echo "GUEST_TIMEOUT_S=$((timeout_s * 3 / 4))"
  for kv in "${envs[@]}"; do echo "export ${kv%%=*}=$(sq "${kv#*=}")"; done
} >"$work/tree/test/env"
cp "$test_script" "$work/tree/test/run.sh"
(cd "$work/tree" && find . -print0 | cpio --null -o -H newc --quiet) | zstd -q >"$work/test.cpio.zst"
cat "$img/initrd.img" "$work/test.cpio.zst" >"$work/initrd.img"

# GUEST_NICS=2 adds eth1 on a second, independent user network: a test moves
# it into a network namespace to act as a second NFS client (the kernel keeps
# NFS client state per network namespace).
nic2=()
case "${GUEST_NICS:-1}" in
  1) ;;
  2) nic2=(-netdev user,id=n1 -device virtio-net-pci,netdev=n1,romfile=) ;;
  *) die "GUEST_NICS must be 1 or 2, got '${GUEST_NICS}'" ;;
esac
# GUEST_IOMMU=1 adds the emulated IOMMU VFIO needs. Off by default: on a loaded
# host its interrupt remapping made boots panic ("timer doesn't work through
# Interrupt-remapped IO-APIC"); no_timer_check skips that probe in any case.
iommu=(); iommu_append=""
case "${GUEST_IOMMU:-0}" in
  0) ;;
  1) iommu=(-device intel-iommu); iommu_append="intel_iommu=on" ;;
  *) die "GUEST_IOMMU must be 0 or 1, got '${GUEST_IOMMU}'" ;;
esac
qemu=(qemu-system-x86_64 -accel tcg -cpu max -machine q35 -m "${GUEST_MEM_MB:-1024}"
  -smp "${GUEST_SMP:-2}" -nographic -no-reboot -serial mon:stdio
  -kernel "$img/vmlinuz" -initrd "$work/initrd.img"
  -append "console=ttyS0 quiet panic=-1 no_timer_check $iommu_append ${GUEST_KERNEL_ARGS:-}"
  "${iommu[@]}"
  -netdev "user,id=n0${GUEST_NETDEV_OPTS:-}" -device virtio-net-pci,netdev=n0,romfile=
  "${nic2[@]}"
  -virtfs "local,path=$out_dir,mount_tag=results,security_model=none,id=results"
  -virtfs "local,path=$img/extra,mount_tag=extra,security_model=none,readonly=on,id=extra"
  "$@")

marker="@@CHIMERA-GUEST@@ $nonce"
log=$out_dir/console-$name.log
boot=1
while :; do
  : >"$log"
  t0=$(date +%s.%N)
  started=""
  # Stream the console (CRs stripped) while recording when the test started.
  # (A read loop, not tr|tee: those block-buffer into a pipe and the stream
  # and the start time would only arrive at the end.)
  timeout -k 10 "$timeout_s" "${qemu[@]}" </dev/null 2>&1 \
    | while IFS= read -r line || [ -n "$line" ]; do
        line=${line//$'\r'/}
        printf '%s\n' "$line" >>"$log"
        printf '[guest %s] %s\n' "$name" "$line"
        case "$line" in *"$marker START"*) date +%s.%N >"$work/t_start" ;; esac
      done || true
  t1=$(date +%s.%N)
  # Not anchored: the firmware's terminal escapes precede the first line.
  if grep -qa "$marker START" "$log"; then started=1; fi
  if [ -n "$started" ] || [ $boot -ge $RETRY_BOOTS_MAX ]; then break; fi
  echo "guest-run: $name: the guest never started the test (boot $boot); retrying once" >&2
  boot=$((boot + 1))
done

secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", a - b}'; }
total_s=$(secs "$t1" "$t0")
if [ -z "$started" ]; then
  echo "guest-run: FAIL $name: the guest never started the test in $boot boots (console: $log)"
  exit 125
fi
boot_s=$(secs "$(cat "$work/t_start")" "$t0")
done_line=$(grep -a "$marker DONE rc=" "$log" | tail -n1 || true)
if [ -z "$done_line" ]; then
  echo "guest-run: FAIL $name: the test started but did not finish within ${timeout_s}s (console: $log)"
  exit 124
fi
rc=${done_line##*rc=}
[[ "$rc" =~ ^[0-9]+$ ]] || { echo "guest-run: FAIL $name: unreadable marker '$done_line'"; exit 2; }
echo "guest-run: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL rc=$rc") $name" \
  "(boot ${boot_s}s, test $(secs "$total_s" "$boot_s")s, total ${total_s}s, boots $boot)"
exit "$rc"
