#!/usr/bin/env bash
# Prefill latency of one attention layer's forward on the CPU: atoll's CCA (model.attention =
# "cca") against its own GQA and MHA at equal width, at T = 512 and 2048, with ZAYA1-8B's
# attention shape (C 2048, heads of 128; MHA 16/16 heads, GQA 16/2, CCA 8/2: GQA and CCA cache
# the same 2 KV heads per token, 8x below MHA). bench/attention_prefill_bench.cc does the timing
# (Google Benchmark, fp32 products, batch 1); this prints one table row per T with the
# median milliseconds and the ratios. The CCA paper reports 1.6-1.7x lower prefill latency
# than MHA for CCA-4x on an H100; this is atoll's CPU path.
#
#   bench/cca_prefill.sh [REPETITIONS]        # default 3
#
# Run it on an otherwise idle machine; on a busy one every figure is a share of what else runs.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
bin=${ATOLL_PREFILL_BENCH:-build/bench/attention_prefill_bench}
[ -x "$bin" ] || { echo "cca_prefill.sh: $bin is missing (fix: build with Google Benchmark installed, libbenchmark-dev)" >&2; exit 1; }
json=$(mktemp)
trap 'rm -f "$json"' EXIT
before=$(cut -d' ' -f1-3 /proc/loadavg)
"$bin" --benchmark_filter=Prefill --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
  --benchmark_format=json >"$json"
echo "load average before: $before, after: $(cut -d' ' -f1-3 /proc/loadavg); threads: ${OMP_NUM_THREADS:-all $(nproc)}"
python3 - "$json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
ms = {}
for r in runs:
    if r.get("aggregate_name") != "median":
        continue
    kind, t = r["label"].split(" T=")
    ms[(kind, int(t))] = r["real_time"]
print("| T | MHA ms | GQA ms | CCA ms | MHA/CCA | GQA/CCA |")
print("|---|---|---|---|---|---|")
for t in sorted({t for _, t in ms}):
    m, g, c = ms[("mha", t)], ms[("gqa", t)], ms[("cca", t)]
    print(f"| {t} | {m:.1f} | {g:.1f} | {c:.1f} | {m / c:.2f} | {g / c:.2f} |")
PY
