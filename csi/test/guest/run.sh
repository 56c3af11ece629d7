#!/usr/bin/env bash
# Real mounts: the CSI node plugin in the QEMU guest against chimerad on the host.
#
#   csi/test/guest/run.sh CHIMERAD_BIN CHIMERA_CSI_BIN
#
# Host side: start chimerad on 127.0.0.1 (NFS + MOUNT + admin), run chimera-csi
# in controller mode and provision a volume through it with csicall (standing in
# for external-provisioner, which cannot be fetched here); the volume context
# names the host as the guest sees it (10.0.2.2). Guest side
# (node-in-guest.sh): chimera-csi as the node plugin stages/publishes with the
# kernel NFSv4.1 client, writes, checks stats/quota/restart/unmount. Back on the
# host: the bytes the guest wrote are read through libnfs (an independent NFS
# client) and compared, then the volume is deleted through the controller.
# The guest also runs csi-sanity with its Node Service specs (real mounts).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
GO=${GO:-go}
CAPACITY_BYTES=$((8 << 20))
TOKEN=csi-guest-token-0123456789
GUEST_TIMEOUT_S=600

die() { echo "csi-guest: FAIL: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: run.sh CHIMERAD_BIN CHIMERA_CSI_BIN"
chimerad=$1; csi_bin=$2
[ -x "$chimerad" ] || die "chimerad binary '$chimerad' missing"
[ -x "$csi_bin" ] || die "chimera-csi binary '$csi_bin' missing"
"$repo/scripts/apt-ensure.sh" libnfs-utils >&2

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-guest.XXXXXX")
out=$work/results; mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# chimerad binds port 0 for NFS (MOUNT answers on it too) and the admin API,
# and logs each port the kernel gave it ({"msg":"listening","service":...,
# "addr":...}); they are read back from the log, never guessed.
cat > "$work/chimerad.json" <<JSON
{
  "common": {"log_level": "info"},
  "server": {"role": "both", "bind": "127.0.0.1", "cores": 1, "nfs_port": 0,
             "mount_port": 0, "portmap_port": 0, "grace_time_s": 0},
  "mounts": {"memfs": {"module": "memfs", "path": "/", "capacity_bytes": "256M"}},
  "exports": {"/memfs": {"path": "/memfs"}},
  "admin": {"bind": "127.0.0.1", "port": 0, "token": "$TOKEN", "tls": false},
  "metrics": {"enabled": false}
}
JSON
"$chimerad" --config "$work/chimerad.json" > "$work/chimerad.log" 2>&1 & pids+=($!)
read -r nfs_port admin_port < <("$repo/scripts/chimerad-ports.py" "$work/chimerad.log" "${pids[-1]}" nfs admin) \
  || { cat "$work/chimerad.log"; die "chimerad did not report its ports"; }
mount_port=$nfs_port
for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$admin_port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$admin_port/healthz" >/dev/null || { cat "$work/chimerad.log"; die "chimerad did not come up"; }

# Static binaries for the guest (no libc there to match).
CGO_ENABLED=0 "$GO" build -o "$out/csicall" "$repo/csi/test/guest/csicall"
(cd "$repo" && CGO_ENABLED=0 "$GO" test -c -o "$out/sanity.test" ./csi/test/sanity)
cp "$csi_bin" "$out/chimera-csi"

"$csi_bin" --mode=controller --endpoint="unix://$work/ctl.sock" > "$work/controller.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do [ -S "$work/ctl.sock" ] && break; sleep 0.1; done
"$out/csicall" -endpoint "unix://$work/ctl.sock" provision -name pvc-e2e -bytes $CAPACITY_BYTES -token "$TOKEN" \
  -param adminEndpoint="http://127.0.0.1:$admin_port" -param nfsServer=10.0.2.2 -param nfsPort=$nfs_port \
  > "$out/volume.json" || { cat "$work/controller.log"; die "CreateVolume through the controller"; }
cat "$out/volume.json"
export_path=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["volumeContext"]["exportPath"])' "$out/volume.json")

set +e
"$repo/e2e/guest/run.sh" -e CAPACITY_BYTES=$CAPACITY_BYTES -e ADMIN_URL="http://10.0.2.2:$admin_port" \
  -e ADMIN_TOKEN=$TOKEN -e NFS_PORT=$nfs_port -o "$out" -t $GUEST_TIMEOUT_S "$here/node-in-guest.sh"
rc=$?
set -e
[ $rc -eq 0 ] || { tail -n 40 "$work/chimerad.log"; die "guest test rc=$rc"; }

want=$(cat "$out/data.sha256")
got=$(nfs-cat "nfs://127.0.0.1$export_path/data?nfsport=$nfs_port&mountport=$mount_port" | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || die "bytes read back through libnfs on the host ($got) differ from what the guest wrote ($want)"
echo "csi-guest: libnfs on the host read back the guest's bytes (sha256 $want)"

"$out/csicall" -endpoint "unix://$work/ctl.sock" delete -volume "$out/volume.json" -token "$TOKEN" || die "DeleteVolume"
echo "csi-guest: PASS"
