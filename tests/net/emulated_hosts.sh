#!/usr/bin/env bash
# Emulated hosts for tests and bench/: N network namespaces, each its own address, joined by a
# router namespace whose links have per-host delay, jitter and loss (tests/net/netem_tool.cc's
# forwarder: this kernel has no netem) and optionally a rate (tc tbf). Needs root.
#
#   emulated_hosts.sh up NAME N [--link I:DELAY_MS[:JITTER_MS[:LOSS]]]... [--rate I:RATE]...
#       hosts NAME-h0 .. NAME-h<N-1> at PREFIX.I.2 (interface eth0, default route via the
#       router), router NAME-r (PREFIX.I.1 on its interface hI); a packet between hosts a and b
#       waits delay(a) + delay(b) each way (a ping: twice that). Prints the hosts' addresses.
#   emulated_hosts.sh cut NAME I       host I's link down (the router's end: a cable pulled)
#   emulated_hosts.sh restore NAME I   and up again
#   emulated_hosts.sh down NAME        every process in the namespaces killed, namespaces removed
#
# PREFIX (default 10.79) is the first two octets: only addresses inside these namespaces. NETEM
# names the atoll_netem binary (default build/tests/atoll_netem). Every wait is bounded.
set -euo pipefail
PREFIX=${PREFIX:-10.79}
NETEM=${NETEM:-$(cd "$(dirname "$0")/../.." && pwd)/build/tests/atoll_netem}

down() {
  local name=$1
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-(r|h[0-9]+)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "/tmp/atoll-netem-$name.log"
}

up() {
  local name=$1 n=$2
  shift 2
  local links=() rates=()
  while [ $# -gt 0 ]; do
    case $1 in
      --link) links+=(--link "$2"); shift 2 ;;
      --rate) rates+=("$2"); shift 2 ;;
      *) echo "emulated_hosts.sh: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  [ "$(id -u)" = 0 ] || { echo "emulated_hosts.sh: needs root (ip netns)" >&2; exit 2; }
  [ -x "$NETEM" ] || { echo "emulated_hosts.sh: no atoll_netem at $NETEM (build the atoll_netem target)" >&2; exit 2; }
  down "$name"
  local r=$name-r
  ip netns add "$r"
  ip -n "$r" link set lo up
  ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  for i in $(seq 0 $((n - 1))); do
    local h=$name-h$i
    ip netns add "$h"
    ip -n "$h" link set lo up
    ip link add eth0 netns "$h" type veth peer name "h$i" netns "$r"
    ip -n "$h" addr add "$PREFIX.$i.2/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" route add default via "$PREFIX.$i.1"
    ip -n "$r" addr add "$PREFIX.$i.1/24" dev "h$i"
    ip -n "$r" link set "h$i" up
    ip netns exec "$r" sysctl -qw "net.ipv4.conf.h$i.rp_filter=0"
  done
  for spec in "${rates[@]}"; do  # I:RATE, on the host's end (what it sends) and the router's (what it gets)
    local i=${spec%%:*} rate=${spec#*:}
    ip netns exec "$name-h$i" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 400ms
    ip netns exec "$r" tc qdisc add dev "h$i" root tbf rate "$rate" burst 64kb latency 400ms
  done
  # The forwarder's TUN device: everything a host sends through the router goes there first
  # (policy routing by the incoming interface), and comes back out of it, delayed, to be routed
  # on by the main table.
  local log=/tmp/atoll-netem-$name.log
  ip netns exec "$r" "$NETEM" forward --prefix "$PREFIX" "${links[@]}" --max-s 1800 >"$log" 2>&1 &
  for _ in $(seq 100); do grep -q ready "$log" 2>/dev/null && break; sleep 0.05; done
  grep -q ready "$log" || { echo "emulated_hosts.sh: the forwarder did not start: $(cat "$log")" >&2; down "$name"; exit 1; }
  ip -n "$r" link set atltun txqueuelen 10000 up
  ip netns exec "$r" sysctl -qw net.ipv4.conf.atltun.rp_filter=0
  ip -n "$r" route add default dev atltun table 100
  for i in $(seq 0 $((n - 1))); do ip -n "$r" rule add iif "h$i" lookup 100; done
  for i in $(seq 0 $((n - 1))); do echo "$name-h$i $PREFIX.$i.2"; done
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down "$2" ;;
  cut) ip -n "$2-r" link set "h$3" down ;;
  restore) ip -n "$2-r" link set "h$3" up ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
