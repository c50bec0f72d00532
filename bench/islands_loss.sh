#!/usr/bin/env bash
# Validation loss at equal tokens: DiLoCo (ISLANDS islands of one worker, H inner steps, int8
# pseudo-gradients) against synchronous data parallel (one island of ISLANDS workers). Same
# binary, config, seed, data, schedule, steps and tokens (each step, every worker trains one
# batch of train.batch_size); the only difference is how the workers combine their progress.
#   bench/islands_loss.sh CONFIG STEPS H [--set k=v ...]
#   bench/islands_loss.sh configs/tiny.toml 600 50
#   bench/islands_loss.sh configs/small.toml 300 20 --set diloco.dp_warmup_steps=100   # warm start
# (diloco.dp_warmup_steps changes nothing in the one-island data-parallel arm.)
# An arm whose final checkpoint is already in ATOLL_BENCH_OUT is kept, so a study stopped by a
# crash or a full disk resumes where it stopped; SKIP_DONE=0 runs both arms afresh.
# Settings: ISLANDS (4), CODEC (int8), ATOLL (build/atoll), ATOLL_BENCH_OUT, SKIP_DONE (1).
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1 steps=$2 h=$3
shift 3
islands=${ISLANDS:-4} codec=${CODEC:-int8}
atoll=${ATOLL:-build/atoll}
out=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-loss}/$(basename "$config" .toml)
[[ ${SKIP_DONE:-1} == 1 ]] || rm -rf "$out"
mkdir -p "$out"
common=(--config "$config" --set train.steps="$steps" --set checkpoint.every=0 "$@")
run() {  # name, launch args...
  local name=$1
  shift
  if [[ ${SKIP_DONE:-1} == 1 && -d $out/$name/checkpoints/$(printf step-%08d "$steps") ]]; then
    echo "$name: done before, kept" >&2
    return
  fi
  rm -rf "${out:?}/$name"
  "$atoll" launch "${common[@]}" --run-dir "$out/$name" "$@" >"$out/$name.log" 2>&1 ||
    { echo "$name failed:" >&2; tail -3 "$out/$name.log" >&2; exit 1; }
  echo "$name done" >&2
}
run ddp --islands 1 --workers-per-island "$islands"
run diloco --islands "$islands" --set diloco.inner_steps="$h" --set diloco.codec="$codec"
# The final models on the whole validation split (the in-run val_loss reads train.eval_batches
# batches only). DiLoCo's last step is a full sync, so island 0's parameters are θ.
for name in ddp diloco; do "$atoll" eval --checkpoint "$out/$name" >"$out/$name.eval.json"; done
python3 - "$out" "$islands" "$h" "$codec" <<'PY'
import json, os, sys
out, islands, h, codec = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def val(name):
    rows = [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl")) if l.strip()]
    return {r["step"]: (r["tokens"], r["val_loss"]) for r in rows if "val_loss" in r}
d, p = val("diloco"), val("ddp")
print(f"| step | tokens | data parallel ({islands} workers) | DiLoCo ({islands} islands, H={h}, {codec}) | difference |")
print("|---:|---:|---:|---:|---:|")
for s in sorted(p):
    if s in d:
        print(f"| {s} | {p[s][0]:,} | {p[s][1]:.4f} | {d[s][1]:.4f} | {100 * (d[s][1] / p[s][1] - 1):+.1f}% |")
e = {n: json.load(open(os.path.join(out, n + ".eval.json"))) for n in ("ddp", "diloco")}
print(f"| final, whole validation split ({e['ddp']['tokens']:,} tokens) | | {e['ddp']['loss']:.4f} | "
      f"{e['diloco']['loss']:.4f} | {100 * (e['diloco']['loss'] / e['ddp']['loss'] - 1):+.1f}% |")
PY
