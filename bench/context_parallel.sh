#!/usr/bin/env bash
# Context parallelism (train.context_parallel, docs/long_context.md): tokens/s and peak RSS per
# worker for configs/tiny.toml at T = 4096, P = 1 (one worker, 1 and 2 threads) against P = 2
# (one island of 2 workers, 1 thread each: the same 2 cores).
#   bench/context_parallel.sh [STEPS] [SEQ_LEN]     # defaults 4 steps, 4096 tokens
# One sequence per step, no evaluation, a checkpoint at the last step only. tokens/s: the last
# metrics row's (the run's tokens over its time; a P-way group counts its sequence once). Peak
# RSS: the largest worker's VmHWM (bench/worker_rss.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/worker_rss.sh
steps=${1:-4} T=${2:-4096} out=/tmp/atoll-context-parallel
rm -rf "$out"; mkdir -p "$out"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; tiny, T = $T, $steps steps"
printf '%-3s %-8s %-8s %12s %12s\n' P workers threads tokens_per_s max_rss_MiB
for spec in "1 1 1" "1 1 2" "2 2 1"; do
  read -r P M threads <<<"$spec"
  run=$out/p$P-t$threads
  build/atoll launch --islands 1 --workers-per-island "$M" --config configs/tiny.toml --run-dir "$run" \
    --set train.context_parallel="$P" --set model.seq_len="$T" --set train.batch_size=1 --set train.steps="$steps" \
    --set train.eval_every=0 --set train.threads="$threads" --set checkpoint.every=0 \
    --set diloco.inner_steps="$steps" >"$run.log" 2>&1 &
  worker_hwm $! || { echo "run P=$P failed: see $run.log"; exit 1; }
  tps=$(python3 -c "import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
print(round([r for r in rows if 'tokens_per_s' in r and r.get('rank', 0) == 0][-1]['tokens_per_s']))" "$run/metrics.jsonl")
  max=$(printf '%s\n' "${HWM_KB[@]}" | sort -n | tail -1)
  printf '%-3s %-8s %-8s %12s %12.1f\n' "$P" "$M" "$threads" "$tps" "$(echo "$max / 1024" | bc -l)"
done
