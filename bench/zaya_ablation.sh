#!/usr/bin/env bash
# ZAYA1's three changes switched on one by one (issue: "ZAYA1's architecture", ablation), at
# ZAYA1's proportions (configs/zaya1-tiny.toml or zaya1-small.toml: top-1 of 16 experts, KV at
# an eighth of the width, tied embeddings) so that the arms differ only in the part named:
#   mixtral   GQA attention, softmax top-k router with the Switch auxiliary loss, plain residual
#   cca       + CCA attention
#   router    + the zaya router (MLP over E+1 classes, balancing biases, no auxiliary loss)
#   residual  + residual scaling
#   zaya      all three (the config itself)
# Each arm trains STEPS steps per seed at equal tokens; with EQUAL_FLOPS=1 each arm also trains
# once (the first seed) for the steps that give it the mixtral arm's training FLOPs (model.h's
# flops_per_token). The final models are evaluated on the whole validation split (atoll eval).
#
#   bench/zaya_ablation.sh [CONFIG] [STEPS]        # default configs/zaya1-tiny.toml 300
#   SEEDS="1 2 3" JOBS=2 THREADS=1 ARMS="mixtral cca router residual zaya" bench/zaya_ablation.sh
#
# Runs go to $ATOLL_BENCH_OUT (default /tmp/atoll-zaya-ablation)/<config>/<arm>-s<seed>; a run
# whose eval.json exists is kept (SKIP_DONE=0 reruns it), and a run cut short continues from its
# newest checkpoint (`atoll train --resume`, bit-identical to an unbroken run; one save per tenth
# of the steps), so an interrupted study resumes where it stopped: the small config's hour per
# arm can span sessions.
# JOBS runs at a time, each with THREADS threads, at nice 19 (so it uses only idle cores when
# the machine is shared; losses do not depend on load, tokens/s does: see the load printed).
# tokens/s is measured apart, by `atoll bench` (3 steps after 1 warm-up, THREADS threads) before
# the runs: the runs' own speeds share the machine with each other and with whatever else runs.
# Prints one markdown table: validation loss (mean and spread over seeds), tokens/s, KV-cache
# bytes per token, attention and total training FLOPs per token, and the expert load balance
# (entropy, min and max load over the last quarter of the steps, zaya router arms).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/zaya1-tiny.toml}
steps=${2:-300}
seeds=${SEEDS:-1 2 3}
jobs=${JOBS:-2}
threads=${THREADS:-1}
arms=${ARMS:-mixtral cca router residual zaya}
atoll=${ATOLL:-build/atoll}
base=${ATOLL_BENCH_OUT:-/tmp/atoll-zaya-ablation}/$(basename "$config" .toml)
[ -x "$atoll" ] || { echo "zaya_ablation.sh: $atoll is missing (fix: cmake --build build)" >&2; exit 1; }
mkdir -p "$base"

arm_sets() {  # the --set overrides that turn the zaya config into the arm
  local mixtral=(--set model.attention=gqa --set model.router=topk --set model.residual_scaling=false
                 --set model.aux_loss_coef=0.01)
  case $1 in
    mixtral) echo "${mixtral[@]}" ;;
    cca) echo "${mixtral[@]}" --set model.attention=cca ;;
    router) echo "${mixtral[@]}" --set model.router=zaya --set model.aux_loss_coef=0 ;;
    residual) echo "${mixtral[@]}" --set model.residual_scaling=true ;;
    zaya) echo "" ;;
    *) echo "zaya_ablation.sh: unknown arm '$1' (arms: mixtral cca router residual zaya)" >&2; exit 2 ;;
  esac
}

bench_json() {  # flops_per_token, tokens/s and the KV-cache bytes of an arm, from a short bench
  local arm=$1
  local out=$base/$arm.bench.json
  [ -s "$out" ] || OMP_NUM_THREADS=$threads nice -n 19 "$atoll" bench --config "$config" $(arm_sets "$arm") \
    --steps 3 --warmup 1 | tail -1 >"$out"
  echo "$out"
}

run_one() {  # arm seed steps dir
  local arm=$1 seed=$2 n=$3 dir=$4
  if [[ ${SKIP_DONE:-1} == 1 && -s $dir/eval.json ]]; then return 0; fi
  if [[ ${SKIP_DONE:-1} == 1 && -s $dir/config.toml ]]; then  # cut short: continue it
    echo "$arm seed $seed: resuming $dir" >&2
    OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive nice -n 19 "$atoll" train --resume --run-dir "$dir" \
      --no-sample >>"$dir.log" 2>&1
  else
    rm -rf "$dir"
    OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive nice -n 19 "$atoll" train --config "$config" $(arm_sets "$arm") \
      --set train.steps="$n" --set train.seed="$seed" --set model.init_seed="$seed" \
      --set train.eval_every=$((n / 3 > 0 ? n / 3 : 1)) --set checkpoint.every=$((n / 10 > 0 ? n / 10 : 1)) \
      --set checkpoint.keep=1 --run-dir "$dir" --no-sample >"$dir.log" 2>&1
  fi
  OMP_NUM_THREADS=$threads nice -n 19 "$atoll" eval --checkpoint "$dir" >"$dir/eval.json.tmp"
  mv "$dir/eval.json.tmp" "$dir/eval.json"
  echo "$arm seed $seed ($n steps) done: $(cat "$dir/eval.json")" >&2
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $jobs jobs x $threads threads at nice 19" >&2
for arm in mixtral $arms; do bench_json "$arm" >/dev/null; done  # all before any run: speeds on an idle machine
base_fpt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["flops_per_token"])' "$(bench_json mixtral)")
pids=()
wait_slot() { while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done; }
first_seed=${seeds%% *}
for arm in $arms; do
  fpt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["flops_per_token"])' "$(bench_json "$arm")")
  for seed in $seeds; do
    wait_slot
    run_one "$arm" "$seed" "$steps" "$base/$arm-s$seed" &
  done
  if [[ ${EQUAL_FLOPS:-1} == 1 ]]; then
    flops_steps=$(python3 -c "print(round($steps * $base_fpt / $fpt))")
    if (( flops_steps != steps )); then
      wait_slot
      run_one "$arm" "$first_seed" "$flops_steps" "$base/$arm-flops-s$first_seed" &
    fi
  fi
done
wait
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$base" "$config" "$steps" "$arms" "$seeds" <<'PY'
import json, os, statistics, sys
base, config, steps, arms, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()

def rows(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]

def attention_flops(cfg):  # training FLOPs per token of the attention blocks: projections, convolutions, T x T
    m = cfg["model"]
    C, L, T, hd = m["dim"], m["n_layers"], m["seq_len"], m["head_dim"]
    QD, KVD = m["n_heads"] * hd, m["n_kv_heads"] * hd
    proj = 2 * C * QD + 2 * C * KVD
    conv = (QD + KVD) * (m.get("cca_time0", 2) + hd * m.get("cca_time1", 2)) if m.get("attention", "gqa") == "cca" else 0
    return L * (6 * (proj + conv) + 12 * T * QD)

def resolved(d):  # the run's own config.toml (tomllib: Python 3.11+)
    import tomllib
    with open(os.path.join(d, "config.toml"), "rb") as f:
        return tomllib.load(f)

print(f"config {config}, {steps} steps per arm at equal tokens, seeds {' '.join(seeds)}")
print("| arm | val loss (mean ± sd) | Δ vs mixtral | equal-FLOPs steps: val loss | tokens/s | KV B/token | attn GFLOP/token | GFLOP/token | load entropy | min/max load | skip |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
base_mean = None
for arm in sorted(arms, key=lambda a: ["mixtral", "cca", "router", "residual", "zaya"].index(a)):
    runs = [os.path.join(base, f"{arm}-s{s}") for s in seeds]
    runs = [d for d in runs if os.path.exists(os.path.join(d, "eval.json"))]
    if not runs:
        continue
    losses = [json.load(open(os.path.join(d, "eval.json")))["loss"] for d in runs]
    mean = statistics.mean(losses)
    sd = statistics.stdev(losses) if len(losses) > 1 else 0.0
    if arm == "mixtral":
        base_mean = mean
    delta = f"{mean - base_mean:+.4f}" if base_mean is not None else ""
    fl = os.path.join(base, f"{arm}-flops-s{seeds[0]}")
    flops_cell = "same steps"
    if os.path.exists(os.path.join(fl, "eval.json")):
        flops_cell = f"{resolved(fl)['train']['steps']}: {json.load(open(os.path.join(fl, 'eval.json')))['loss']:.4f}"
    b = json.load(open(os.path.join(base, f"{arm}.bench.json")))
    tps = b["tokens_per_s"]
    cfg = resolved(runs[0])
    tail = [r for d in runs for r in rows(d) if "load_entropy" in r and r["step"] > 0.75 * steps]
    if tail:
        ent = statistics.mean(statistics.mean(r["load_entropy"]) for r in tail)
        lo = statistics.mean(min(r["load_min"]) for r in tail)
        hi = statistics.mean(max(r["load_max"]) for r in tail)
        skip = statistics.mean(statistics.mean(r["load_skip"]) for r in tail)
        load = (f"{ent:.3f}", f"{lo:.3f} / {hi:.3f}", f"{skip:.3f}")
    else:
        load = ("n/a", "n/a", "")
    print(f"| {arm} | {mean:.4f} ± {sd:.4f} | {delta} | {flops_cell} | {tps:.0f} | {b['kv_cache_bytes_per_token']:.0f} | "
          f"{attention_flops(cfg) / 1e9:.4f} | {b['flops_per_token'] / 1e9:.4f} | {load[0]} | {load[1]} | {load[2]} |")
PY
