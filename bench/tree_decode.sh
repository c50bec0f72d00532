#!/usr/bin/env bash
# Decoding latency per token at long context (docs/long_context.md, tree attention): one
# process against `atoll generate --workers 2` and `4` (the KV cache sharded, three all-reduces
# per layer and token). The checkpoint: configs/tiny.toml trained one step at model.seq_len =
# 32768 (so that generate holds that much context). Each run decodes greedily from a short
# prompt up to the context given; ATOLL_GENERATE_TIMING=1 has generate print the time of its
# last 64 steps, at the end of that context: the latency per token reported.
#   bench/tree_decode.sh [CONTEXT...]     # default: 8192 32768
# Threads: one process gets 2 (the machine's cores), each of P processes 1 (OMP_NUM_THREADS).
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
    --set train.steps=1 --set train.eval_every=0 --set checkpoint.every=0 --set train.threads=2 >"$out/train.log" 2>&1 ||
    { echo "training the checkpoint failed: see $out/train.log"; exit 1; }
  echo "checkpoint: tiny at model.seq_len = 32768, one step ($(($(date +%s) - start)) s)"
fi
printf '%-8s %-8s %16s %14s %10s\n' context workers ms_per_token total_s at_context
for ctx in "${contexts[@]}"; do
  for P in 1 2 4; do
    threads=1
    [ "$P" = 1 ] && threads=2
    log=$out/c$ctx-p$P.log
    start=$(date +%s.%N)
    ATOLL_GENERATE_TIMING=1 OMP_NUM_THREADS=$threads build/atoll generate --checkpoint "$ckpt" --prompt "The island" \
      --temperature 0 --max-tokens "$ctx" --workers "$P" >/dev/null 2>"$log" || { echo "generate failed: see $log"; exit 1; }
    total=$(echo "$(date +%s.%N) - $start" | bc -l)
    line=$(grep '^timing:' "$log")
    ms=$(sed -E 's/.*the last [0-9]+ ([0-9.]+) ms per token.*/\1/' <<<"$line")
    at=$(sed -E 's/.*at context ([0-9]+).*/\1/' <<<"$line")
    printf '%-8s %-8s %16s %14.1f %10s\n' "$ctx" "$P" "$ms" "$total" "$at"
  done
done
