#!/usr/bin/env bash
# Import time and peak RSS of `--init-from` (issue 40; docs/benchmarks.md): a Mixtral-shaped model
# of about 1.1 B parameters (C 2048, 16 layers, 8 experts of H 1024, 16 query / 8 key-value heads,
# V 32000) written by the test generator (tests/reference/hf_moe.py big) in three BF16 shards, then
# imported by build/bench/import_hf_rss (the import alone, into fp32 parameters), twice: with the shards
# dropped from the page cache first (dd iflag=nocache: read from the disk) and with them cached.
# Beside each, the time `cat` takes to read the same files in the same cache state: reading at
# disk speed means an import about as fast as cat. The goal for memory: peak RSS under 1.2 x the
# fp32 model.
#   bench/import_hf.sh [C H L E NH NKV V SHARDS]
set -euo pipefail
cd "$(dirname "$0")/.."
shape=("${@:-2048 1024 16 8 16 8 32000 3}")
read -r -a shape <<<"${shape[*]}"
w=/tmp/atoll-import-hf
rm -rf "$w"; mkdir -p "$w"
build/atoll train --config configs/tiny.toml --set train.steps=1 --set checkpoint.every=0 --set train.eval_every=0 \
  --run-dir "$w/tok" --no-sample >"$w/tok.log" 2>&1 || { echo "tokenizer run failed: see $w/tok.log"; exit 1; }
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
t0=$(date +%s.%N)
params=$(/usr/bin/python3 tests/reference/hf_moe.py big "$w/hf" "${shape[@]}" "$w/tok/tokenizer.model")
echo "generated $params parameters in $(du -sh "$w/hf" | cut -f1) ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s)"
drop() { for f in "$w"/hf/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done; }
sync
for state in cold warm; do
  [ "$state" = cold ] && drop
  t0=$(date +%s.%N); cat "$w"/hf/*.safetensors >/dev/null; cat_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  [ "$state" = cold ] && drop
  echo "$state: cat ${cat_s} s; import $(build/bench/import_hf_rss "$w/hf")"
done
rm -rf "$w"
