#!/usr/bin/env bash
# The pNFS test network: one private storage subnet with a metadata server,
# three data servers and a client, each in its own network namespace, as on a
# cluster where every node has its own address.
#
#   topology.sh up      create it (idempotent; a half-built one is completed)
#   topology.sh down    delete it (idempotent)
#   topology.sh check   exit 0 iff every namespace has its address and reaches
#                       every other node (one ping each)
#   topology.sh addr NODE   print NODE's address (mds, ds1, ds2, ds3, cli)
#
# Layout (10.77.0.0/24; e2e/peers uses 10.254.0.0/30, nothing here overlaps):
#
#   chim-mds 10.77.0.1   chim-ds1 .11   chim-ds2 .12   chim-ds3 .13   chim-cli .100
#        eth0               eth0           eth0           eth0           eth0
#         |                  |              |              |              |
#   chim-sw:  p-mds ------- p-ds1 -------- p-ds2 -------- p-ds3 -------- p-cli   (bridge chbr0)
#
# Why the bridge lives in its own namespace (chim-sw) rather than the host's:
# the host's own network stays untouched (no bridge, no route to 10.77.0.0/24,
# nothing to leak to if a run is killed before teardown), and deleting the six
# namespaces removes every link, since a veth dies with its namespace.
set -euo pipefail

SUBNET_PREFIX=10.77.0
SUBNET_BITS=24
NS_SWITCH=chim-sw
BRIDGE=chbr0
NODES=(mds ds1 ds2 ds3 cli)
declare -A HOST_PART=([mds]=1 [ds1]=11 [ds2]=12 [ds3]=13 [cli]=100)

usage() { echo "usage: topology.sh up|down|check|addr NODE" >&2; exit 2; }
die() { echo "topology: ERROR: $*" >&2; exit 1; }

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
ns_of() { echo "chim-$1"; }
addr_of() { echo "$SUBNET_PREFIX.${HOST_PART[$1]}"; }

up() {
  ns_exists $NS_SWITCH || ip netns add $NS_SWITCH
  ip -n $NS_SWITCH link set lo up
  ip -n $NS_SWITCH link show $BRIDGE >/dev/null 2>&1 || ip -n $NS_SWITCH link add $BRIDGE type bridge
  ip -n $NS_SWITCH link set $BRIDGE up
  local n ns port
  for n in "${NODES[@]}"; do
    ns=$(ns_of "$n"); port=p-$n
    ns_exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    # A node whose eth0 is missing (half-built run) gets a fresh pair.
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip -n $NS_SWITCH link del "$port" 2>/dev/null || true
      ip -n $NS_SWITCH link add "$port" type veth peer name eth0 netns "$ns"
    fi
    ip -n $NS_SWITCH link set "$port" master $BRIDGE
    ip -n $NS_SWITCH link set "$port" up
    ip -n "$ns" addr replace "$(addr_of "$n")/$SUBNET_BITS" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

down() {
  local n
  for n in "${NODES[@]}"; do
    if ns_exists "$(ns_of "$n")"; then ip netns delete "$(ns_of "$n")"; fi
  done
  if ns_exists $NS_SWITCH; then ip netns delete $NS_SWITCH; fi
}

check() {
  local n m
  for n in "${NODES[@]}"; do
    ns_exists "$(ns_of "$n")" || die "namespace $(ns_of "$n") is missing"
    ip -n "$(ns_of "$n")" -br addr show eth0 | grep -qw "$(addr_of "$n")/$SUBNET_BITS" \
      || die "$(ns_of "$n") has no $(addr_of "$n")/$SUBNET_BITS on eth0"
  done
  # Every node reaches the MDS and the client reaches every node: the paths
  # the test uses. (A fresh bridge port forwards at once: no STP here.)
  for n in "${NODES[@]}"; do
    for m in mds cli; do
      [ "$n" = "$m" ] && continue
      ip netns exec "$(ns_of "$n")" ping -c1 -W2 -q "$(addr_of "$m")" >/dev/null \
        || die "$(ns_of "$n") cannot reach $m at $(addr_of "$m")"
    done
  done
}

[ $# -ge 1 ] || usage
case "$1" in
  up) [ $# -eq 1 ] || usage; up ;;
  down) [ $# -eq 1 ] || usage; down ;;
  check) [ $# -eq 1 ] || usage; check ;;
  addr) [ $# -eq 2 ] || usage; [ -n "${HOST_PART[$2]:-}" ] || die "unknown node '$2' (want one of ${NODES[*]})"; addr_of "$2" ;;
  *) usage ;;
esac
