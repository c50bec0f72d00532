#!/usr/bin/env bash
# Decoding latency per token at long context (docs/long_context.md, tree attention): one
# process against `atoll generate --workers 2` and `4` (the KV cache sharded, three all-reduces
# per layer and token). The checkpoint: configs/tiny.toml trained one step at model.seq_len =
# 32768 (so that generate holds that much context). Each run decodes greedily from a short
# prompt up to the context given; ATOLL_GENERATE_TIMING=1 has generate print the time of its
# last 64 steps, at the end of that context: the latency per token at that context (last_ms),
# and of all its steps (mean_ms: the mean over contexts 0 to CONTEXT; the steps' cost grows
# linearly with the context, so about the latency at half of it).
#   bench/tree_decode.sh [CONTEXT...]     # default: 8192 32768
# Threads (OMP_NUM_THREADS): one process with 2 (the machine's cores) and with 1, each of P
# processes 1. Each run decodes the whole context token by token: minutes at 8k, far more at 32k
# on a loaded machine (the cost grows as the context squared).
set -euo pipefail
cd "$(dirname "$0")/.."
contexts=("$@")
[ ${#contexts[@]} -gt 0 ] || contexts=(8192 32768)
out=/tmp/atoll-tree-decode ckpt=/tmp/atoll-tree-decode/tiny-32k
mkdir -p "$out"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; commit $(git rev-parse --short HEAD)"
if [ ! -e "$ckpt/config.toml" ]; then
  rm -rf "$ckpt"
  start=$(date +%s)
  build/atoll train --config configs/tiny.toml --run-dir "$ckpt" --set model.seq_len=32768 --set train.batch_size=1 \
    --set train.steps=1 --set train.eval_every=0 --set checkpoint.every=0 --set train.threads=2 \
    --set data.val_fraction=0.05 >"$out/train.log" 2>&1 ||
    { echo "training the checkpoint failed: see $out/train.log"; exit 1; }
  echo "checkpoint: tiny at model.seq_len = 32768, one step ($(($(date +%s) - start)) s)"
fi
printf '%-8s %-8s %-8s %10s %10s %10s %10s\n' context workers threads last_ms mean_ms total_s at_context
for ctx in "${contexts[@]}"; do
  for spec in "1 2" "1 1" "2 1" "4 1"; do
    read -r P threads <<<"$spec"
    log=$out/c$ctx-p$P-t$threads.log
    start=$(date +%s.%N)
    ATOLL_GENERATE_TIMING=1 OMP_NUM_THREADS=$threads build/atoll generate --checkpoint "$ckpt" --prompt "The island" \
      --temperature 0 --max-tokens "$ctx" --workers "$P" >/dev/null 2>"$log" || { echo "generate failed: see $log"; exit 1; }
    total=$(echo "$(date +%s.%N) - $start" | bc -l)
    line=$(grep '^timing:' "$log")
    ms=$(sed -E 's/.*the last [0-9]+ ([0-9.]+) ms per token.*/\1/' <<<"$line")
    mean=$(sed -E 's/.*then ([0-9]+) tokens ([0-9.]+) s;.*/\2 \1/' <<<"$line" | awk '{printf "%.3f", 1e3 * $1 / $2}')
    at=$(sed -E 's/.*at context ([0-9]+).*/\1/' <<<"$line")
    printf '%-8s %-8s %-8s %10s %10s %10.1f %10s\n' "$ctx" "$P" "$threads" "$ms" "$mean" "$total" "$at"
  done
done
