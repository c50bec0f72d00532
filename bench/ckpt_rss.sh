#!/usr/bin/env bash
# Per-worker peak memory with ZeRO-1 (optim.zero1, docs/islands.md) against the unsharded
# step, at M = 1, 2, 4 workers in one island (issue 20).
#   bench/ckpt_rss.sh [STEPS]          # default 2 steps
# configs/tiny.toml widened so that the optimizer state shows (model.dim 256, expert_hidden
# 1024: ~15M parameters, 60 MB per fp32 buffer, so m + v = 120 MB unsharded), batch 2 x 64
# tokens (activations small beside the state), one
# thread per worker, no evaluation, a checkpoint at the last step only (its save included).
# Peak RSS: VmHWM of each worker process (a child of the launcher), sampled every 50 ms while
# it runs (VmHWM only grows; the last sample is taken at most 50 ms before the worker exits).
# Prints one row per (M, zero1): the workers' median and max VmHWM in MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/worker_rss.sh
steps=${1:-2}
bin=$(pwd)/build/atoll
runs=/tmp/atoll-ckpt-rss
rm -rf "$runs"; mkdir -p "$runs"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-3s %-6s %12s %12s\n' M zero1 median_MiB max_MiB
for M in 1 2 4; do
  for zero in false true; do
    run=$runs/m$M-$zero
    "$bin" launch --islands 1 --workers-per-island "$M" --config configs/tiny.toml --run-dir "$run" \
      --set optim.zero1="$zero" --set model.dim=256 --set model.expert_hidden=1024 --set train.steps="$steps" \
      --set train.batch_size=2 --set model.seq_len=64 --set train.eval_every=0 --set train.threads=1 --set checkpoint.every=0 \
      --set diloco.inner_steps="$steps" >"$run.log" 2>&1 &
    worker_hwm $! || { echo "run M=$M zero1=$zero failed: see $run.log"; exit 1; }
    printf '%s\n' "${HWM_KB[@]}" | sort -n | awk -v M="$M" -v z="$zero" '{v[NR]=$1} END {
      printf "%-3s %-6s %12.1f %12.1f\n", M, z, v[int((NR+1)/2)]/1024, v[NR]/1024 }'
  done
done
