#!/usr/bin/env bash
# Run a command next to an NFS-Ganesha server (VFS FSAL over a size-bounded
# tmpfs), to validate the guest harness against a known-good NFS server.
#
#   ganesha.sh COMMAND [ARGS...]
#
# Everything happens in private network and mount namespaces: Ganesha insists
# on rpcbind and listens on [::] whatever Bind_addr says, so the namespace is
# what confines it; rpcbind's socket and Ganesha's state go on a private /run.
# COMMAND runs inside the same namespaces with GANESHA_NFS_PORT,
# GANESHA_MNT_PORT and GANESHA_EXPORT set; a QEMU guest started there with user
# networking reaches the namespace's loopback as 10.0.2.2. Exit status: the
# command's. Nothing listens outside the namespace.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
NFS_PORT=12049
MNT_PORT=12048
EXPORT_BYTES_MAX=$((512 << 20))   # the tmpfs bound: the server's data memory
START_WAIT_S_MAX=60

die() { echo "ganesha: ERROR: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: ganesha.sh COMMAND [ARGS...]"
[ "$(id -u)" = 0 ] || die "needs root (namespaces, mounts)"

if [ "${1:-}" != --inside ]; then
  "$repo/scripts/apt-ensure.sh" nfs-ganesha nfs-ganesha-vfs rpcbind iproute2 >&2
  exec unshare --net --mount --propagation private -- "$0" --inside "$@"
fi
shift

# --- inside the namespaces ---------------------------------------------------
ip link set lo up
# Ganesha 4.3 finds no address in a loopback-only namespace ("No IP address
# found"): a veth pair whose both ends stay here gives it one that never leaves.
ip link add cg0 type veth peer name cg1
ip addr add 169.254.77.1/30 dev cg0
ip link set cg0 up; ip link set cg1 up

mount -t tmpfs -o size=16m,mode=0755 tmpfs /run
state=/run/ganesha-harness
mkdir -p "$state/recovery" /run/rpcbind /run/ganesha
export_dir=$state/export
mkdir -p "$export_dir"
mount -t tmpfs -o size=$EXPORT_BYTES_MAX,mode=0777 tmpfs "$export_dir"

cat >"$state/ganesha.conf" <<EOF
NFS_CORE_PARAM {
  Bind_addr = 127.0.0.1;
  NFS_Port = $NFS_PORT;
  MNT_Port = $MNT_PORT;
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  Protocols = 3, 4;
  Mount_Path_Pseudo = true;
}
NFSV4 {
  Graceless = true;
  Only_Numeric_Owners = true;
  RecoveryRoot = "$state/recovery";
}
EXPORT {
  Export_Id = 1;
  Path = "$export_dir";
  Pseudo = "/export";
  Access_Type = RW;
  Squash = No_Root_Squash;
  SecType = sys;
  Protocols = 3, 4;
  Transports = TCP;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = EVENT; }
EOF

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

rpcbind -f -w &
pids+=($!)
ganesha.nfsd -F -f "$state/ganesha.conf" -L "$state/ganesha.log" -p "$state/ganesha.pid" &
pids+=($!)

listening() { ss -Hltn "sport = :$1" | grep -q LISTEN; }
for ((i = 0; i < START_WAIT_S_MAX * 10; i++)); do
  if listening $NFS_PORT && listening $MNT_PORT; then break; fi
  kill -0 "${pids[1]}" 2>/dev/null || { cat "$state/ganesha.log" >&2; die "ganesha.nfsd exited during start-up"; }
  sleep 0.1
done
listening $NFS_PORT || { tail -n 30 "$state/ganesha.log" >&2; die "ganesha did not listen on $NFS_PORT within ${START_WAIT_S_MAX}s"; }
echo "ganesha: serving /export (VFS on a ${EXPORT_BYTES_MAX}-byte tmpfs) on 127.0.0.1:$NFS_PORT, mount $MNT_PORT" >&2

set +e
GANESHA_NFS_PORT=$NFS_PORT GANESHA_MNT_PORT=$MNT_PORT GANESHA_EXPORT=/export "$@"
rc=$?
set -e
[ $rc -eq 0 ] || { echo "ganesha: command failed (rc $rc); last server log lines:" >&2; tail -n 15 "$state/ganesha.log" >&2; }
exit $rc
