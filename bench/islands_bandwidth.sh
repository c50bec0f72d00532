#!/usr/bin/env bash
# Compute utilization of DiLoCo islands on rate-limited links. Each island is a worker in its
# own network namespace, joined to a hub namespace (a bridge, and Redis) by a veth pair with a
# `tbf` rate limit on both ends (netem is not available in this kernel; tbf is). The islands
# talk to each other only through those links, over real TCP, as `atoll worker` processes
# started by hand: the same way a run spans machines.
#
#   bench/islands_bandwidth.sh run [RATES...]   blocking vs streaming-overlapped vs the delayed
#                                               outer step at each rate (default: 20mbit
#                                               100mbit); needs root
#   bench/islands_bandwidth.sh up N RATE        only build the namespaces (atl-hub, atl-i0..)
#   bench/islands_bandwidth.sh down             remove them (also done on exit by `run`)
#
# Utilization = compute_s / wall_s of each worker (compute_s: forward, backward and the inner
# optimizer step; the rest is waiting for the network or for the slower island), in steady
# state (from its first metrics row to the one before the last step) and over the whole run
# (the last step adds one blocking sync of every fragment, so every island ends on the same
# θ: a one-time cost a long run amortizes). Settings: ISLANDS (2), STEPS (240), H (30),
# FRAGMENTS (3), OVERLAP (steps each fragment's exchange hides behind, 8), CODEC (int8), MODES
# ("blocking overlapped delayed"; delayed: diloco.outer_delay = 1, each exchange behind a round;
# topk, not in the default: blocking with diloco.expert_topk = TOPK (0.25), the sparse expert
# exchange; delayed_topk, not in the default: both at once), CONFIG (configs/tiny.toml), ATOLL (build/atoll), ATOLL_BENCH_OUT
# (/tmp/atoll-islands-bandwidth). Extra `--set` for the workers: WORKER_SETS="--set k=v ...".
set -euo pipefail
cd "$(dirname "$0")/.."
hub=atl-hub
subnet=10.77.0
store_port=6399

down() {
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^atl-(hub|i[0-9]+)$' || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
}

up() {  # islands, rate
  local n=$1 rate=$2
  down
  ip netns add $hub
  ip -n $hub link set lo up
  ip -n $hub link add br0 type bridge
  ip -n $hub addr add $subnet.254/24 dev br0
  ip -n $hub link set br0 up
  for i in $(seq 0 $((n - 1))); do
    local ns=atl-i$i
    ip netns add $ns
    ip -n $ns link set lo up
    ip link add veth-i$i netns $ns type veth peer name hub-i$i netns $hub
    ip -n $ns addr add $subnet.$((i + 1))/24 dev veth-i$i
    ip -n $ns link set veth-i$i up
    ip -n $hub link set hub-i$i master br0
    ip -n $hub link set hub-i$i up
    # The limit on both ends: what an island sends and what it receives.
    ip netns exec $ns tc qdisc add dev veth-i$i root tbf rate "$rate" burst 64kb latency 200ms
    ip netns exec $hub tc qdisc add dev hub-i$i root tbf rate "$rate" burst 64kb latency 200ms
  done
  ip netns exec $hub redis-server --bind $subnet.254 --port $store_port --save '' --appendonly no --protected-mode no \
    --daemonize yes --logfile /dev/null >/dev/null
  for _ in $(seq 50); do
    ip netns exec $hub redis-cli -h $subnet.254 -p $store_port ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  echo "redis-server did not start in namespace $hub" >&2
  exit 1
}

run_one() {  # name, rate, extra --set args...
  local name=$1 rate=$2
  shift 2
  local dir=$out/$name
  up "$islands" "$rate"
  mkdir -p "$dir"
  local pids=()
  for i in $(seq 0 $((islands - 1))); do
    # One thread each: the islands share this machine's cores, as they would not share a
    # real island's; the bandwidth, not the cores, is what this measures.
    ip netns exec atl-i$i "$atoll" worker --store redis://$subnet.254:$store_port --island "$i" --rank 0 \
      --islands "$islands" --run-id "$name" --run-dir "$dir/i$i" --config "$config" \
      --set data.dir="$out/data" --set train.threads=1 --set train.steps="$steps" --set train.eval_every=0 \
      --set checkpoint.every=0 --set train.log_every=1 --set diloco.inner_steps="$H" --set diloco.codec="$codec" \
      "$@" $WORKER_SETS >"$dir/i$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if [ $failed = 1 ]; then
    echo "$name failed:" >&2
    tail -3 "$dir"/i*.log >&2
    exit 1
  fi
  echo "$name done" >&2
}

case ${1:-run} in
  up) up "${2:-2}" "${3:-20mbit}"; exit 0 ;;
  down) down; exit 0 ;;
  run) shift || true ;;
  *) echo "usage: $0 run [RATES...] | up N RATE | down" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces and tc)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "needs redis-server" >&2; exit 1; }
atoll=$(realpath "${ATOLL:-build/atoll}")
out=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-bandwidth}
islands=${ISLANDS:-2} steps=${STEPS:-240} H=${H:-30} fragments=${FRAGMENTS:-3} overlap=${OVERLAP:-8}
codec=${CODEC:-int8} config=${CONFIG:-configs/tiny.toml} WORKER_SETS=${WORKER_SETS:-}
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(20mbit 100mbit)
trap down EXIT
rm -rf "$out"
mkdir -p "$out"
"$atoll" data prepare --out "$out/data" >"$out/data.log" 2>&1
modes=${MODES:-blocking overlapped delayed}
for rate in "${rates[@]}"; do
  for mode in $modes; do
    case $mode in
      blocking) run_one "blocking-$rate" "$rate" ;;
      overlapped) run_one "overlapped-$rate" "$rate" --set diloco.fragments="$fragments" --set diloco.overlap_steps="$overlap" ;;
      delayed) run_one "delayed-$rate" "$rate" --set diloco.outer_delay=1 ;;
      topk) run_one "topk-$rate" "$rate" --set diloco.expert_topk="${TOPK:-0.25}" ;;
      delayed_topk)
        run_one "delayed_topk-$rate" "$rate" --set diloco.outer_delay=1 --set diloco.expert_topk="${TOPK:-0.25}" ;;
      *) echo "unknown mode $mode (blocking, overlapped, delayed, topk, delayed_topk)" >&2; exit 2 ;;
    esac
  done
done
python3 - "$out" "$islands" "$modes" "${rates[@]}" <<'PY'
import json, os, sys
out, islands, modes, rates = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def util(a, b):
    return (b["compute_s"] - a["compute_s"]) / (b["time_s"] - a["time_s"])
def summary(name):
    per = []
    for i in range(islands):
        rows = [json.loads(l) for l in open(os.path.join(out, name, f"i{i}", "metrics.jsonl")) if l.strip()]
        per.append((util(rows[0], rows[-2]), util(rows[0], rows[-1]), rows[-1]))
    return per
print("| link | sync | utilization, steady state | utilization, whole run | wall s | comm_s | MB sent per island |")
print("|---|---|---|---|---:|---:|---:|")
for rate in rates:
    for mode in modes:
        p = summary(f"{mode}-{rate}")
        steady = " / ".join(f"{100 * u[0]:.1f}%" for u in p)
        whole = " / ".join(f"{100 * u[1]:.1f}%" for u in p)
        print(f"| {rate} | {mode} | {steady} | {whole} | {max(u[2]['time_s'] for u in p):.1f} | "
              f"{max(u[2]['comm_s'] for u in p):.1f} | {max(u[2]['comm_bytes'] for u in p) / 1e6:.1f} |")
PY
