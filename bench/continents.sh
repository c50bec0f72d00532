#!/usr/bin/env bash
# Compute utilization of 4 DiLoCo islands over emulated continents (issue 38). Four emulated
# hosts (tests/net/emulated_hosts.sh: network namespaces behind a router whose forwarder adds
# delay and loss, tc tbf for the rate), one island per host started by hand (`atoll worker`),
# the store on host 0:
#   host 0 and host 1: one "city" (1 ms each way to the router: 2-4 ms round trips between them)
#   host 2: 40 ms each way (80 ms round trip to the city)
#   host 3: 75 ms each way, 1% loss (150 ms round trip to the city)
# every host's link limited to RATE. The same four islands first run on loopback (no
# namespaces: the baseline step time). Streaming DiLoCo with overlap (FRAGMENTS fragments, each
# exchange hidden behind OVERLAP inner steps).
#
#   bench/continents.sh [RATES...]          (default: 50mbit 500mbit); needs root
#
# Per run it prints the wall time of the steady-state steps (first metrics row to the one before
# the last step, whose final blocking sync a long run amortizes), its ratio to loopback's
# (the goal: >= 97% of loopback's speed), and compute_s / wall_s of each island.
# Settings: STEPS (240), H (30), FRAGMENTS (3), OVERLAP (8), CODEC (int8), BATCH (8),
# CONFIG (configs/tiny.toml), ATOLL (build/atoll), ATOLL_BENCH_OUT (/tmp/atoll-continents).
# The machine's load goes into the timings (the islands share its cores): say what else ran.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "continents.sh: needs root (ip netns, tc)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "continents.sh: needs redis-server" >&2; exit 2; }
ATOLL=$(realpath "${ATOLL:-build/atoll}")
OUT=${ATOLL_BENCH_OUT:-/tmp/atoll-continents}
STEPS=${STEPS:-240} H=${H:-30} FRAGMENTS=${FRAGMENTS:-3} OVERLAP=${OVERLAP:-8} CODEC=${CODEC:-int8}
BATCH=${BATCH:-8} CONFIG=${CONFIG:-configs/tiny.toml}
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(50mbit 500mbit)
name=atlcont
hosts=tests/net/emulated_hosts.sh
trap '$hosts down $name; pkill -f "redis-server 127.0.0.1:6391" 2>/dev/null || true' EXIT
rm -rf "$OUT"; mkdir -p "$OUT"
"$ATOLL" data prepare --out "$OUT/data" >"$OUT/data.log" 2>&1

# run NAME STORE_HOST PREFIX_CMD...: four workers; PREFIX_CMD(i) is "ip netns exec $name-h$i" or nothing.
run() {
  local run=$1 store=$2 netns=$3
  local d=$OUT/$run pids=()
  mkdir -p "$d"
  for i in 0 1 2 3; do
    local wrap=()
    [ "$netns" = yes ] && wrap=(ip netns exec "$name-h$i")
    "${wrap[@]}" "$ATOLL" worker --store "redis://$store" --island "$i" --rank 0 --islands 4 --run-id "$run" \
      --config "$CONFIG" --run-dir "$d/i$i" --set data.dir="$OUT/data" --set train.threads=1 \
      --set train.steps="$STEPS" --set train.batch_size="$BATCH" --set train.eval_every=0 --set checkpoint.every=0 \
      --set train.log_every=1 --set diloco.inner_steps="$H" --set diloco.codec="$CODEC" \
      --set diloco.fragments="$FRAGMENTS" --set diloco.overlap_steps="$OVERLAP" >"$d/i$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ $failed = 0 ] || { echo "continents.sh: run $run failed:" >&2; tail -n 3 "$d"/i*.log >&2; exit 1; }
  echo "$run done" >&2
}

redis-server --bind 127.0.0.1 --port 6391 --protected-mode no --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
for _ in $(seq 100); do grep -q "Ready to accept" "$OUT/redis.log" && break; sleep 0.1; done
run loopback 127.0.0.1:6391 no
pkill -f "redis-server 127.0.0.1:6391" || true

for rate in "${rates[@]}"; do
  $hosts up $name 4 --link 0:1 --link 1:1 --link 2:40 --link 3:75:0:0.01 \
    --rate "0:$rate" --rate "1:$rate" --rate "2:$rate" --rate "3:$rate" >"$OUT/hosts-$rate.log"
  ip netns exec $name-h0 redis-server --bind 10.79.0.2 --port 6390 --protected-mode no --save '' --appendonly no \
    >"$OUT/redis-$rate.log" 2>&1 &
  for _ in $(seq 100); do grep -q "Ready to accept" "$OUT/redis-$rate.log" && break; sleep 0.1; done
  run "continents-$rate" 10.79.0.2:6390 yes
  $hosts down $name
done

python3 - "$OUT" "${rates[@]}" <<'PY'
import json, os, sys
out, rates = sys.argv[1], sys.argv[2:]
def rows(run, i):
    return [json.loads(l) for l in open(os.path.join(out, run, f"i{i}", "metrics.jsonl")) if l.strip()]
def steady(run):
    per = [rows(run, i) for i in range(4)]
    wall = max(r[-2]["time_s"] - r[0]["time_s"] for r in per)
    util = [(r[-2]["compute_s"] - r[0]["compute_s"]) / (r[-2]["time_s"] - r[0]["time_s"]) for r in per]
    return wall, util, per
base, base_util, _ = steady("loopback")
print("| links | steady wall s | speed against loopback | compute_s / wall_s per island | comm_s (max) | MB sent per island (max) |")
print("|---|---:|---:|---|---:|---:|")
for run in ["loopback"] + [f"continents-{r}" for r in rates]:
    wall, util, per = steady(run)
    print(f"| {run} | {wall:.1f} | {100 * base / wall:.1f}% | " + " / ".join(f"{100 * u:.1f}%" for u in util) +
          f" | {max(r[-1]['comm_s'] for r in per):.1f} | {max(r[-1]['comm_bytes'] for r in per) / 1e6:.1f} |")
PY
