#!/usr/bin/env bash
# A private network namespace for a server under test and its client.
#
#   e2e/peers/netns.sh up NAME     create it (idempotent)
#   e2e/peers/netns.sh down NAME   delete it (idempotent)
#   e2e/peers/netns.sh check NAME  exit 0 iff it exists with lo up
#
# Why a namespace: NFS-Ganesha listens on [::] whatever its Bind_addr says and
# needs its own rpcbind on port 111, so only a namespace confines it. Every
# server the benchmark compares runs in the same kind of namespace, so the
# client reaches each over the same loopback path.
#
# Inside: loopback up, plus a veth pair whose two ends both stay in the
# namespace (its address never leaves it). Ganesha 4.3 fails with "No IP address
# found" in a namespace that has only loopback; the veth gives it one.
set -euo pipefail

usage() { echo "usage: $0 up|down|check NAME" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd="$1" name="$2"
# Names stay short: the veth names are derived from them (IFNAMSIZ is 16).
[[ "$name" =~ ^[a-z0-9-]{1,24}$ ]] || { echo "netns.sh: bad namespace name '$name' (want [a-z0-9-], at most 24 chars)" >&2; exit 2; }
# The private address inside the namespace (10.254.0.1/30 by default; it cannot
# collide with the host's routes because it exists only inside the namespace).
addr="${NETNS_VETH_ADDR:-10.254.0.1/30}"

exists() { ip netns list | awk '{print $1}' | grep -qx "$name"; }

case "$cmd" in
up)
  exists || ip netns add "$name"
  ip -n "$name" link set lo up
  if ! ip -n "$name" link show nsv0 >/dev/null 2>&1; then
    ip -n "$name" link add nsv0 type veth peer name nsv1
  fi
  ip -n "$name" addr replace "$addr" dev nsv0
  ip -n "$name" link set nsv0 up
  ip -n "$name" link set nsv1 up
  ;;
down)
  if exists; then ip netns delete "$name"; fi
  ;;
check)
  exists && ip -n "$name" link show lo | grep -q 'UP'
  ;;
*) usage ;;
esac
