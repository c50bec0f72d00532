#!/usr/bin/env bash
# Bit-identity of two trees: the same runs with the same seed and thread count, once with the
# binary of a reference revision and once with this tree's build/atoll; every logged loss,
# val_loss, grad_norm and theta_hash must match exactly, and so must `atoll eval` and the bytes
# of the Hugging Face export. Used around refactors that must not change a single bit.
#   bench/identity.sh [REV] [STEPS]     # REV: the reference revision (default: HEAD's first parent
#                                       # on main before the change, given explicitly is best)
# The reference is built once into $OUT/ref-<sha>/build (a git worktree), then reused.
# Runs: tiny with AdamW and with Muon, each in fp32 and bf16; a 2-island int8 DiLoCo run with
# 2 workers per island (H = 5). Threads are fixed (train.threads) so the reductions agree.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/identity.sh REV [STEPS]}
steps=${2:-40}
out=${ATOLL_IDENTITY_OUT:-/tmp/atoll-identity}
sha=$(git rev-parse --short=12 "$rev")
ref=$out/ref-$sha
mkdir -p "$out"
if [ ! -x "$ref/build/atoll" ]; then
  rm -rf "$ref"; git worktree prune
  git worktree add --detach "$ref" "$sha" >/dev/null
  cmake -S "$ref" -B "$ref/build" -DCMAKE_BUILD_TYPE=Release -DATOLL_BUILD_TESTS=OFF -DATOLL_BUILD_BENCH=OFF \
    ${ATOLL_CMAKE_ARGS:-} >/dev/null
  cmake --build "$ref/build" -j"$(nproc)" --target atoll >/dev/null
fi
new=$(pwd)/build/atoll
[ -x "$new" ] || { echo "identity: no build/atoll in this tree (scripts/setup.sh builds it)"; exit 1; }

run_all() {  # $1 = binary, $2 = output folder
  local bin=$1 dir=$2 common=(--config configs/tiny.toml --set train.steps="$steps" --set train.eval_every=20
                              --set train.threads=2 --set checkpoint.every=0)
  rm -rf "$dir"; mkdir -p "$dir"
  for opt in adamw muon; do
    for prec in fp32 bf16; do
      "$bin" train "${common[@]}" --set optim.name=$opt --set train.precision=$prec --run-dir "$dir/$opt-$prec" \
        >"$dir/$opt-$prec.log" 2>&1
    done
  done
  "$bin" eval --checkpoint "$dir/adamw-fp32" >"$dir/eval.json" 2>"$dir/eval.log"
  "$bin" export --checkpoint "$dir/adamw-fp32" --format hf --out "$dir/export" >"$dir/export.log" 2>&1
  "$bin" launch --islands 2 --workers-per-island 2 --config configs/tiny.toml --set train.steps="$steps" \
    --set train.eval_every=20 --set train.threads=1 --set diloco.inner_steps=5 --set diloco.codec=int8 \
    --run-dir "$dir/islands" >"$dir/islands.log" 2>&1
}

echo "identity: reference $sha, steps $steps" >&2
run_all "$ref/build/atoll" "$out/runs-ref"
run_all "$new" "$out/runs-new"
python3 - "$out/runs-ref" "$out/runs-new" <<'PY'
import hashlib, json, os, sys
ref, new = sys.argv[1], sys.argv[2]
keys = ("step", "loss", "aux_loss", "z_loss", "grad_norm", "val_loss", "theta_hash", "outer_step", "island", "rank")
def rows(path):
    out = []
    for line in open(path):
        o = json.loads(line)
        out.append({k: o[k] for k in keys if k in o})
    return sorted(out, key=lambda r: (r.get("island", 0), r.get("rank", 0), r["step"]))
bad = 0
for run in ("adamw-fp32", "adamw-bf16", "muon-fp32", "muon-bf16", "islands"):
    a, b = rows(f"{ref}/{run}/metrics.jsonl"), rows(f"{new}/{run}/metrics.jsonl")
    same = a == b and len(a) > 0
    bad += not same
    last = [r for r in a if "loss" in r][-1]
    print(f"{run:11s} {len(a):4d} rows  {'identical' if same else 'DIFFER'}  (final loss {last['loss']!r})")
def digest(path):
    data = open(path, "rb").read()
    if path.endswith("eval.json"):  # the checkpoint's path names the run folder, which differs
        o = json.loads(data)
        o.pop("checkpoint", None)
        data = json.dumps(o, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]
for name in ("eval.json",) + tuple(f"export/{f}" for f in sorted(os.listdir(f"{ref}/export"))):
    same = digest(f"{ref}/{name}") == digest(f"{new}/{name}")
    bad += not same
    print(f"{name:24s} {'identical' if same else 'DIFFER'}")
print("bit-identical" if bad == 0 else f"{bad} differences")
sys.exit(1 if bad else 0)
PY
