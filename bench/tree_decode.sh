#!/usr/bin/env bash
# Decoding latency per token at long context (docs/long_context.md, tree attention): one
# process against `atoll generate --workers 2` and `4` (the KV cache sharded; per layer and
# token every rank sends its partial result to every other). The checkpoint: configs/tiny.toml trained one step at model.seq_len =
# 32768 (so that generate holds that much context). Each run prefills a prompt of about
# CONTEXT - 64 tokens (--prompt-file: the built-in corpus's text, the fortunes files in name
# order, cut to that many tokens) and decodes 64 tokens greedily after it;
# ATOLL_GENERATE_TIMING=1 has generate print the prefill's time and the 64 steps': the latency
# per token at that context (ms_per_token), the prefill's tokens per second, and the first
# process's peak RSS (rss_mib: the weights, its share of the cache, the prefill's buffers).
#   bench/tree_decode.sh [CONTEXT...]     # default: 8192 32768
# Threads (OMP_NUM_THREADS): one process with 2 (the machine's cores) and with 1, each of P
# processes 1.
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

# The corpus text, and prompts of a given length in tokens under the checkpoint's tokenizer:
# generate refuses a prompt longer than the context and says how many tokens it is, so a
# prompt's length is that of [prompt | pad] less the pad's (a pad alone longer than the context).
corpus=$out/corpus.txt pad=$out/pad.txt probe=$out/probe.txt
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat >"$corpus"
head -c 1400000 "$corpus" | tail -c 400000 | sed '1d;$d' >"$pad"
refused_tokens() {
  build/atoll generate --checkpoint "$ckpt" --prompt-file "$1" --max-tokens 1 2>&1 >/dev/null |
    sed -nE 's/.* is ([0-9]+) tokens.*/\1/p' || true
}
pad_tokens=$(refused_tokens "$pad")
[ -n "$pad_tokens" ] || { echo "could not count the pad's tokens (generate should refuse $pad as too long)"; exit 1; }
tokens_of() { cat "$1" "$pad" >"$probe" && echo $(($(refused_tokens "$probe") - pad_tokens)); }
# Whole lines of the corpus, about `target` tokens (within 3% under it), into `file`.
make_prompt() {
  local target=$1 file=$2 bytes=$(($1 * 4)) n=0
  for _ in 1 2 3 4 5; do
    head -c "$bytes" "$corpus" | sed '$d' >"$file"
    n=$(tokens_of "$file")
    [ "$n" -le "$target" ] && [ "$n" -ge $((target * 97 / 100)) ] && return 0
    bytes=$(awk -v b="$bytes" -v t="$target" -v n="$n" 'BEGIN { printf "%d", b * 0.985 * t / n }')
  done
  echo "could not cut a prompt of about $target tokens (last: $n)"
  exit 1
}

printf '%-8s %-8s %-8s %10s %10s %12s %10s %10s %8s\n' context workers threads prompt prefill_s prefill_tok_s \
  ms_per_token at_context rss_mib
for ctx in "${contexts[@]}"; do
  prompt=$out/prompt-$ctx.txt
  make_prompt $((ctx - 64 - 1)) "$prompt"  # the start-of-text token takes a position too
  for spec in "1 2" "1 1" "2 1" "4 1"; do
    read -r P threads <<<"$spec"
    log=$out/c$ctx-p$P-t$threads.log
    ATOLL_GENERATE_TIMING=1 OMP_NUM_THREADS=$threads build/atoll generate --checkpoint "$ckpt" --prompt-file "$prompt" \
      --temperature 0 --max-tokens 65 --workers "$P" >/dev/null 2>"$log" || { echo "generate failed: see $log"; exit 1; }
    # timing: prefill N tokens S s, then D tokens S s; the last D MS ms per token, at context C; peak RSS R MiB
    read -r n prefill_s decoded ms at rss < <(grep '^timing:' "$log" |
      sed -E 's/.*prefill ([0-9]+) tokens ([0-9.]+) s, then ([0-9]+) tokens.*the last [0-9]+ ([0-9.]+) ms per token, at context ([0-9]+); peak RSS ([0-9]+) MiB.*/\1 \2 \3 \4 \5 \6/')
    [ "$decoded" = 64 ] || echo "note: $decoded tokens decoded after the prompt (the model ended the text?): see $log"
    printf '%-8s %-8s %-8s %10s %10s %12.0f %10s %10s %8s\n' "$ctx" "$P" "$threads" "$n" "$prefill_s" \
      "$(echo "$n / $prefill_s" | bc -l)" "$ms" "$at" "$rss"
  done
done
