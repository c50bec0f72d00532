#!/usr/bin/env bash
# The issue-41 matrix (docs/benchmarks.md "Experts in the outer step"): bench/islands_experts.sh
# for every config x islands x H x seed, then one table of each arm's validation-loss gap to data
# parallel (paired by seed: mean ± standard error over the seeds) and its bytes per trained token.
# Data parallel (one island of ISLANDS workers) does not depend on H: it runs once per config,
# islands and seed, and every H reuses it.
#   CONFIGS="configs/zaya1-tiny.toml" ISLANDS_LIST="4" H_LIST="30" SEEDS="42 43 44" \
#       bench/islands_experts_matrix.sh STEPS [--set k=v ...]
# Arms: ARMS ("ddp mean tokens") and ARM_SETS, as bench/islands_experts.sh takes them.
# Results go to $ATOLL_BENCH_OUT/h<H>/s<seed>/<config>-<islands>/ (default
# /tmp/atoll-islands-experts-matrix); finished arms are kept (SKIP_DONE=0 reruns them), so an
# interrupted matrix resumes. Runs go one at a time at nice 19 (NICE=0: at normal priority, for
# figures of a quiet machine while others build at nice 19). Other settings: CODEC, ATOLL.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=$1
shift
configs=${CONFIGS:-configs/zaya1-tiny.toml} islands_list=${ISLANDS_LIST:-4} h_list=${H_LIST:-30}
seeds=${SEEDS:-42 43 44} arms=${ARMS:-ddp mean tokens}
base=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-experts-matrix}
first_h=${h_list%% *}
for config in $configs; do
  name=$(basename "$config" .toml)
  for n in $islands_list; do
    for h in $h_list; do
      for seed in $seeds; do
        out=$base/h$h/s$seed
        mkdir -p "$out/$name-$n"
        # Data parallel of the first H serves every H (same config, seed, steps and tokens).
        if [[ $h != "$first_h" && ! -e $out/$name-$n/ddp ]]; then
          ln -s "$base/h$first_h/s$seed/$name-$n/ddp" "$out/$name-$n/ddp"
        fi
        for arm in $arms; do
          echo "$(date -u +%H:%M:%S) $name islands=$n H=$h seed=$seed $arm" >&2
          ARMS=$arm ISLANDS=$n ATOLL_BENCH_OUT=$out nice -n "${NICE:-19}" bench/islands_experts.sh "$config" \
            "$steps" "$h" --set train.seed="$seed" "$@" >/dev/null
        done
      done
    done
  done
done
python3 - "$base" "$configs" "$islands_list" "$h_list" "$seeds" "$arms" <<'PY'
import json, os, statistics, sys
base, configs, islands, hs, seeds, arms = (a.split() for a in sys.argv[1:])
base = base[0]
def run(h, seed, name, arm):
    d = os.path.join(base, "h" + h, "s" + seed, name)
    ev = os.path.join(d, arm + ".eval.json")
    if not os.path.exists(ev):
        return None
    last, tokens = {}, 0
    for line in open(os.path.join(d, arm, "metrics.jsonl")):
        if line.strip():
            r = json.loads(line)
            if "comm_bytes" in r:
                last[(r.get("island", 0), r.get("rank", 0))] = r["comm_bytes"]
            tokens = r.get("tokens", tokens)
    return json.load(open(ev))["loss"], sum(last.values()) / tokens
print("| config | islands | H | arm | seeds | validation loss | gap to data parallel | bytes per token |")
print("|---|---:|---:|---|---|---:|---:|---:|")
for config in configs:
    for n in islands:
        name = os.path.basename(config)[: -len(".toml")] + "-" + n
        for h in hs:
            for arm in arms:
                got = [(s, run(h, s, name, arm), run(h, s, name, "ddp")) for s in seeds]
                got = [(s, r, d) for s, r, d in got if r and d]
                if not got:
                    continue
                loss = statistics.mean(r[0] for _, r, _ in got)
                bpt = statistics.mean(r[1] for _, r, _ in got)
                gaps = [100 * (r[0] / d[0] - 1) for _, r, d in got]
                gap = "" if arm == "ddp" else f"{statistics.mean(gaps):+.2f}%"
                if arm != "ddp" and len(gaps) > 1:
                    gap += f" ± {statistics.stdev(gaps) / len(gaps) ** 0.5:.2f}%"
                if arm != "ddp":
                    gap += " (" + ", ".join(f"{g:+.2f}" for g in gaps) + ")"
                ss = " ".join(s for s, _, _ in got)
                print(f"| {name.rsplit('-', 1)[0]} | {n} | {h} | {arm} | {ss} | {loss:.4f} | {gap} | {bpt:,.1f} |")
PY
