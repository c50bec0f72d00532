#!/usr/bin/env bash
# Does the data loader keep up with training (issue 22)? Prints the tokens/s the loader delivers
# (one dataset, and a mixture of three; build/bench/loader_bench, Google Benchmark) beside the
# tokens/s of the fastest step atoll takes: `atoll bench` on configs/tiny.toml (T 256, B 8) and
# on the micro shape of the tests (--set overrides). The loader keeps up when its rate is far
# above the step's: it runs on its own thread, one batch ahead.
# Usage: bench/loader_throughput.sh; ATOLL=build/atoll, LOADER_BENCH=build/bench/loader_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
ATOLL=${ATOLL:-build/atoll}
LOADER_BENCH=${LOADER_BENCH:-build/bench/loader_bench}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "## loader (tokens/s delivered, shards in the page cache)"
"$LOADER_BENCH" --benchmark_min_time=0.5 --benchmark_format=console 2>/dev/null |
  awk '/BM_Loader/ { for (i = 1; i <= NF; ++i) if ($i ~ /^tokens_per_s=/) { sub("tokens_per_s=", "", $i); print $1, $i } }'
echo "## training step (tokens/s consumed, atoll bench)"
"$ATOLL" bench --config configs/tiny.toml --steps 5 --warmup 1 | tail -1 |
  /usr/bin/python3 -c "import json, sys; r = json.load(sys.stdin); print('tiny', r.get('tokens_per_s'))"
"$ATOLL" bench --config configs/tiny.toml --steps 5 --warmup 1 --set model.dim=32 --set model.n_layers=1 \
  --set model.n_heads=2 --set model.n_kv_heads=1 --set model.head_dim=16 --set model.expert_hidden=32 \
  --set model.vocab_size=512 --set model.seq_len=32 --set train.batch_size=4 | tail -1 |
  /usr/bin/python3 -c "import json, sys; r = json.load(sys.stdin); print('micro', r.get('tokens_per_s'))"
