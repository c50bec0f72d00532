#!/usr/bin/env bash
# The MoE-aware outer step at equal tokens (docs/islands.md "Experts in the outer step"): data
# parallel (one island of ISLANDS workers) against DiLoCo with ISLANDS islands of one worker,
# plain (diloco.expert_merge = mean) and with each expert's Δ weighted by its islands' tokens
# (diloco.expert_merge = tokens), and the sparse expert exchange (arm topkF: diloco.expert_topk = F,
# each island sends the fraction F of each layer's experts per round, the rest kept in its
# error-feedback residual). Same binary, config, seed, data, schedule, steps and tokens.
# Prints one table row per arm: the final model's loss on the whole validation split, its gap to
# data parallel, and the bytes every worker sent per trained token.
#   bench/islands_experts.sh CONFIG STEPS H [--set k=v ...]
#   ISLANDS=2 bench/islands_experts.sh configs/tiny.toml 150 30
#   ISLANDS=2 ARMS="ddp mean topk0.25" bench/islands_experts.sh configs/zaya1-tiny.toml 120 30
# An arm whose final checkpoint is already in ATOLL_BENCH_OUT is kept (SKIP_DONE=0: every arm afresh).
# An arm is `ddp`, `mean` or `tokens` (diloco.expert_merge), or a name of ARM_SETS, whose settings
# go after the others: ARM_SETS="topk=diloco.expert_topk=0.25 topk_tokens=diloco.expert_merge=tokens,diloco.expert_topk=0.25"
# Settings: ISLANDS (4), CODEC (int8), ARMS ("ddp mean tokens"), ARM_SETS, ATOLL (build/atoll),
# ATOLL_BENCH_OUT (/tmp/atoll-islands-experts), SKIP_DONE (1).
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1 steps=$2 h=$3 islands=${ISLANDS:-4} codec=${CODEC:-int8} atoll=${ATOLL:-build/atoll}
shift 3
out=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-experts}/$(basename "$config" .toml)-$islands
mkdir -p "$out"
common=(--config "$config" --set train.steps="$steps" --set checkpoint.every=0 "$@")
for arm in ${ARMS:-ddp mean tokens}; do
  if [[ $arm == ddp ]]; then
    args=(--islands 1 --workers-per-island "$islands")
  elif [[ $arm =~ ^topk[0-9.]+$ ]]; then  # topkF: diloco.expert_topk = F
    args=(--islands "$islands" --set diloco.inner_steps="$h" --set diloco.codec="$codec"
          --set diloco.expert_topk="${arm#topk}")
  else
    merge=mean
    [[ $arm == tokens ]] && merge=tokens
    args=(--islands "$islands" --set diloco.inner_steps="$h" --set diloco.codec="$codec"
          --set diloco.expert_merge="$merge")
    for spec in ${ARM_SETS:-}; do
      [[ ${spec%%=*} == "$arm" ]] || continue
      IFS=, read -ra kvs <<<"${spec#*=}"
      for kv in "${kvs[@]}"; do args+=(--set "$kv"); done
    done
  fi
  [[ ${SKIP_DONE:-1} == 1 && -d $out/$arm/checkpoints/$(printf step-%08d "$steps") ]] && continue
  rm -rf "${out:?}/$arm"
  "$atoll" launch "${common[@]}" --run-dir "$out/$arm" "${args[@]}" >"$out/$arm.log" 2>&1 ||
    { echo "$arm failed:" >&2; tail -3 "$out/$arm.log" >&2; exit 1; }
done
# The final models on the whole validation split; DiLoCo's last step is a full sync (island 0 = θ).
for arm in ${ARMS:-ddp mean tokens}; do "$atoll" eval --checkpoint "$out/$arm" >"$out/$arm.eval.json"; done
python3 - "$out" "${ARMS:-ddp mean tokens}" <<'PY'
import json, os, sys
out, arms = sys.argv[1], sys.argv[2].split()
def bytes_and_tokens(arm):
    last = {}
    for line in open(os.path.join(out, arm, "metrics.jsonl")):
        if not line.strip():
            continue
        r = json.loads(line)
        if "comm_bytes" in r:
            last[(r.get("island", 0), r.get("rank", 0))] = r["comm_bytes"]
        tokens = r.get("tokens", 0)
    return sum(last.values()), tokens
loss = {a: json.load(open(os.path.join(out, a + ".eval.json")))["loss"] for a in arms}
for a in arms:
    sent, tokens = bytes_and_tokens(a)
    gap = f"{100 * (loss[a] / loss['ddp'] - 1):+.2f}%" if "ddp" in loss else "-"
    print(f"| {a} | {loss[a]:.4f} | {gap} | {sent / tokens:,.1f} |")
PY
