#!/usr/bin/env bash
# The sealing's cost per outer step (docs/benchmarks.md "Sealed traffic"): sealing throughput on
# this machine (build/bench/seal_bench, one core), then a sealed run of 2 islands on loopback
# (default configs/zaya1-tiny.toml, H = 20) for what an outer step moves and how long its inner
# steps take. Each island seals what it sends and opens what it receives, about 2 x its bytes per
# outer step; the share is that time over the outer step's time at a link rate: H inner steps plus
# the exchange's wire time (bytes / rate, blocking), at 50 and 500 Mbit/s.
#   bench/seal_cost.sh [CONFIG] [STEPS] [H]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/zaya1-tiny.toml}
steps=${2:-60}
h=${3:-20}
atoll=${ATOLL:-build/atoll}
out=${ATOLL_BENCH_OUT:-/tmp/atoll-seal-cost}
rm -rf "$out"
mkdir -p "$out"
build/bench/seal_bench --benchmark_min_time=0.5 --benchmark_filter='/262144' --benchmark_format=json \
  >"$out/seal_bench.json"
"$atoll" launch --islands 2 --config "$config" --run-dir "$out/run" --set train.steps="$steps" \
  --set diloco.inner_steps="$h" --set train.eval_every=0 --set checkpoint.every=0 --set train.threads=1 \
  >"$out/run.log" 2>&1 || { echo "the sealed run failed:" >&2; tail -3 "$out/run.log" >&2; exit 1; }
grep -q forged "$out/run/events.jsonl" && { echo "forged frames in a clean run" >&2; exit 1; }
python3 - "$out" "$h" <<'PY'
import json, sys
out, h = sys.argv[1], int(sys.argv[2])
bench = {b["name"].split("/")[0]: b["bytes_per_second"] for b in json.load(open(f"{out}/seal_bench.json"))["benchmarks"]}
rows = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
mine = [r for r in rows if r.get("island") == 0 and r.get("rank", 0) == 0]
outer = [r for r in mine if "theta_hash" in r]
per_outer = (outer[-1]["comm_bytes"] - outer[0]["comm_bytes"]) / max(1, len(outer) - 1)
step_s = (mine[-1]["time_s"] - mine[0]["time_s"]) / (mine[-1]["step"] - mine[0]["step"])  # loopback exchanges included
seal_s = per_outer / bench["BM_Seal"] + per_outer / bench["BM_Open"]
print(f"seal {bench['BM_Seal'] / 1e9:.2f} GB/s, open {bench['BM_Open'] / 1e9:.2f} GB/s (256 KiB frames, one core)")
print(f"bytes sent per outer step per island: {per_outer:,.0f}; mean step {step_s:.3f} s; H = {h}")
print(f"sealing per outer step: {seal_s * 1e3:.2f} ms")
for mbit in (50, 500):
    wire = per_outer * 8 / (mbit * 1e6)
    step = h * step_s + wire
    print(f"{mbit} Mbit/s: outer step {step:.2f} s (exchange {wire:.2f} s): sealing {100 * seal_s / step:.3f}% of it, "
          f"{100 * seal_s / wire:.2f}% of the exchange")
PY
