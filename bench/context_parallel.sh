#!/usr/bin/env bash
# Context parallelism (train.context_parallel, docs/long_context.md): tokens/s, peak RSS per
# worker and ring attention's time for configs/tiny.toml (or CONFIG=...) at each length T given, P = 1 (one
# worker, 2 threads) against P = 2 and 4 (one island of P workers, 1 thread each: on a 2-core
# machine P = 4 runs two processes per core).
#   bench/context_parallel.sh [STEPS] [T...]     # defaults: 2 steps; T = 4096 8192 16384
#   PS="2 4" bench/context_parallel.sh ...        # only these P (default "1 2 4")
#   CONFIG=configs/zaya1-tiny.toml bench/context_parallel.sh ...   # another model (default tiny)
# The validation split is 5% (data.val_fraction), since the built-in corpus's 2% is shorter than
# 32k tokens; nothing validates, but the loader checks that a split holds a sequence.
# One sequence per step, no evaluation, no checkpoint. tokens/s: the last metrics row's (the run's
# tokens over its time; a P-way group counts its sequence once). Peak RSS: the largest worker's
# VmHWM (bench/worker_rss.sh). tok_per_cpu_s: the run's tokens over its workers' CPU seconds
# (start-up included): on a loaded machine, where P processes get another share of the cores
# than one process of 2 threads, the fairer comparison of the kernels. ring compute/wait: seconds in ring attention computing blocks and
# blocked on ring transfers (metrics ring_compute_s, ring_wait_s), the mean over ranks;
# busy = compute / (compute + wait); ring_sync: under ATOLL_RING_SYNC=1, the seconds spent
# meeting the neighbours before each transfer (a slower peer's lateness, apart from the wait).
# Environment (ATOLL_CP_LAYOUT=plain, ATOLL_RING_OVERLAP=0, ATOLL_RING_SYNC=1) passes to the
# workers: bench/ring_overlap.sh compares them.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/worker_rss.sh
steps=${1:-2} config=${CONFIG:-configs/tiny.toml}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(4096 8192 16384)
out=/tmp/atoll-context-parallel
rm -rf "$out"; mkdir -p "$out"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; $config, $steps steps; commit $(git rev-parse --short HEAD)"
printf '%-6s %-2s %-8s %12s %13s %12s %10s %10s %6s %10s\n' T P threads tokens_per_s tok_per_cpu_s max_rss_MiB \
  ring_comp ring_wait busy ring_sync
for T in "${lengths[@]}"; do
  for P in ${PS:-1 2 4}; do
    threads=1
    [ "$P" = 1 ] && threads=2
    run=$out/t$T-p$P
    start=$(date +%s)
    build/atoll launch --islands 1 --workers-per-island "$P" --config "$config" --run-dir "$run" \
      --set train.context_parallel="$P" --set model.seq_len="$T" --set train.batch_size=1 --set train.steps="$steps" \
      --set train.eval_every=0 --set data.val_fraction=0.05 --set train.threads="$threads" --set checkpoint.every=0 \
      --set diloco.inner_steps="$steps" >"$run.log" 2>&1 &
    worker_hwm $! || { echo "run T=$T P=$P failed: see $run.log"; exit 1; }
    read -r tps comp wait busy sync < <(python3 -c "import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
tps=[r for r in rows if 'tokens_per_s' in r and r.get('rank', 0) == 0][-1]['tokens_per_s']
last={}
for r in rows:
    if 'ring_compute_s' in r: last[r['rank']] = r
if last:
    c=sum(r['ring_compute_s'] for r in last.values())/len(last); w=sum(r['ring_wait_s'] for r in last.values())/len(last)
    s=sum(r.get('ring_sync_s', 0) for r in last.values())/len(last)
    print(round(tps), '%.2f' % c, '%.2f' % w, '%.2f' % (c/(c+w)), '%.2f' % s if s else '-')
else:
    print(round(tps), '-', '-', '-', '-')" "$run/metrics.jsonl")
    max=$(printf '%s\n' "${HWM_KB[@]}" | sort -n | tail -1)
    printf '%-6s %-2s %-8s %12s %13.0f %12.1f %10s %10s %6s %10s   (%ss)\n' "$T" "$P" "$threads" "$tps" \
      "$(echo "$steps * $T / $CPU_S" | bc -l)" "$(echo "$max / 1024" | bc -l)" "$comp" "$wait" "$busy" "$sync" \
      "$(($(date +%s) - start))"
  done
done
