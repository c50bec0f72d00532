#!/usr/bin/env bash
# How atoll's training speed holds up when it shares the cores: tiny-config `atoll train`
# throughput alone, beside a second `atoll train` (same settings), and beside a shell busy
# loop, under OpenMP wait settings given as environment assignments:
#   old   GOMP_SPINCOUNT=300000: GNU libgomp's own default (what atoll ran with before it chose
#         one; libgomp reports 300000 when neither variable is set), ~8 ms of spinning here
#   new   neither variable set: atoll's default (cli/openmp_wait.h)
#   VAR=VALUE[,VAR=VALUE]  anything else, e.g. OMP_WAIT_POLICY=passive
#
#   bench/share_machine.sh [STEPS] [SETTING...]      # default: 60 old new
#
# Every run uses train.threads = 0 (all cores), as a user's would. Prints one table row per
# setting: the median tokens/s of the logged steps (the first step, a warm-up, left out) and
# the slowdown against alone. Run it on an otherwise idle machine; on a busy one every figure
# is also a share of whatever else runs.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
shift || true
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(old new)
atoll=${ATOLL:-build/atoll}
out=${ATOLL_SHARE_OUT:-/tmp/atoll-share-machine}
rm -rf "$out" && mkdir -p "$out"

background=()
stop_background() {
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${background[@]}"; do wait "$pid" 2>/dev/null || true; done
  background=()
}
trap stop_background EXIT

# The command of one training run (in `cmd`): env(1) with a clean slate for both variables and
# the setting's assignments, then atoll; env execs atoll, so a background run's $! is atoll's pid.
train_cmd() {  # setting run_name steps
  local assignments=$1
  [ "$assignments" = old ] && assignments=GOMP_SPINCOUNT=300000
  [ "$assignments" = new ] && assignments=
  local -a assigned
  IFS=, read -ra assigned <<<"$assignments"
  cmd=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "${assigned[@]}" "$atoll" train --config configs/tiny.toml
       --no-sample --run-dir "$out/$2" --set train.steps="$3" --set train.eval_every=0 --set checkpoint.every=0)
}
train() { train_cmd "$@"; "${cmd[@]}" >"$out/$2.log" 2>&1; }

median_tokens_per_s() {  # run_name
  python3 - "$out/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(round(statistics.median(r["tokens_per_s"] for r in rows if r["step"] > 1)))
PY
}

wait_for_first_step() {  # run_name pid: until the background run logs a step (it trains now)
  until [ -s "$out/$1/metrics.jsonl" ]; do
    kill -0 "$2" 2>/dev/null || { echo "share_machine: background run $1 ended early: $out/$1.log" >&2; exit 1; }
    sleep 0.5
  done
}

train new prepare 2 # prepares and caches the built-in corpus, untimed

echo "| setting | alone tokens/s | beside a 2nd atoll train | slowdown | beside a busy loop | slowdown |"
echo "|---|---:|---:|---:|---:|---:|"
for s in "${settings[@]}"; do
  name=${s//[^A-Za-z0-9]/_}
  train "$s" "$name-alone" "$steps"
  alone=$(median_tokens_per_s "$name-alone")

  train_cmd "$s" "$name-other" 1000000
  "${cmd[@]}" >"$out/$name-other.log" 2>&1 &
  background=($!)
  wait_for_first_step "$name-other" "${background[0]}"
  train "$s" "$name-pair" "$steps"
  stop_background
  pair=$(median_tokens_per_s "$name-pair")

  bash -c 'while :; do :; done' &
  background=($!)
  train "$s" "$name-busy" "$steps"
  stop_background
  busy=$(median_tokens_per_s "$name-busy")

  python3 -c "import sys; s, a, p, b = sys.argv[1], *map(float, sys.argv[2:]); \
print(f'| {s} | {a:.0f} | {p:.0f} | {a / p:.1f}x | {b:.0f} | {a / b:.1f}x |')" "$s" "$alone" "$pair" "$busy"
done
