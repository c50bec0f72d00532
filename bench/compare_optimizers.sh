#!/usr/bin/env bash
# Muon against AdamW at equal tokens: trains CONFIG twice (same data, seed and schedule) and
# prints validation loss at equal steps plus the first step at which each reaches AdamW's
# final validation loss.
#   bench/compare_optimizers.sh configs/tiny.toml 400 [extra --set args...]
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1 steps=$2
shift 2
out=${ATOLL_BENCH_OUT:-/tmp/atoll-optim-compare}/$(basename "$config" .toml)
rm -rf "$out"
mkdir -p "$out"
for opt in adamw muon; do
  build/atoll train --config "$config" --run-dir "$out/$opt" --no-sample --set train.steps="$steps" \
    --set optim.name=$opt "$@" >"$out/$opt.log" 2>&1 || { tail -3 "$out/$opt.log"; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def val(opt):
    rows = [json.loads(l) for l in open(f"{out}/{opt}/metrics.jsonl") if l.strip()]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}, rows
(va, ra), (vm, rm) = val("adamw"), val("muon")
target = va[max(va)]
def reach(v):
    hit = [s for s in sorted(v) if v[s] <= target]
    return hit[0] if hit else None
print("| step | AdamW val loss | Muon val loss |\n|---:|---:|---:|")
for s in sorted(va):
    print(f"| {s} | {va[s]:.4f} | {vm.get(s, float('nan')):.4f} |")
tps = lambda rows: sorted(r["tokens_per_s"] for r in rows)[len(rows) // 2]
print(f"\nAdamW final val loss {target:.4f}: AdamW reaches it at step {reach(va)}, Muon at step {reach(vm)}.")
print(f"Median tokens/s: AdamW {tps(ra):.0f}, Muon {tps(rm):.0f}.")
PY
