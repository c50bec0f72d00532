#!/usr/bin/env bash
# The crash loop of issue 20, at scale (cli_checkpoint_crash_test runs 20 of these points in
# ctest): a 2-island x 2-worker tiny-config run that saves every 2 steps is killed as a whole
# (ATOLL_FAULT=crash: the chosen worker SIGKILLs the launcher, every worker dies with it) at
# seeded points of the save path: copy (the saved tensors half copied into staging while the
# next step runs), tensor (a part half written, on the background writer while
# training goes on), part (durable, not handed on), manifest (written, not renamed), rename (not
# yet `latest`), latest (moved, old ones not pruned), in save 1..4, on any worker (the committer's
# points on island 0 rank 0). Every time: `latest`, if any, loads (`atoll eval`), names a step
# the commit order allows, and `--resume` ends with every metrics row (loss, theta_hash) equal to
# the uninterrupted run's.
#   bench/ckpt_crash_loop.sh [POINTS] [SEED]       # default 200 points, seed 1
# Prints one line per failure and a summary; exits 1 if any point failed.
set -euo pipefail
cd "$(dirname "$0")/.."
points=${1:-200}
seed=${2:-1}
atoll=${ATOLL:-$(pwd)/build/atoll}
out=${ATOLL_CRASH_OUT:-/tmp/atoll-ckpt-crash-loop}
rm -rf "$out"; mkdir -p "$out"
common=(launch --islands 2 --workers-per-island 2 --config configs/tiny.toml --set train.steps=8
        --set train.eval_every=0 --set checkpoint.every=2 --set checkpoint.keep=2 --set diloco.inner_steps=2
        --set fault.max_restarts=0 --set train.threads=1 --set train.batch_size=2 --set model.seq_len=64
        --set model.n_layers=2)
rows() {  # island rank step loss theta_hash, sorted
  python3 -c "
import json,sys
for l in open(sys.argv[1]):
    o=json.loads(l); print(o['island'],o['rank'],o['step'],repr(o['loss']),o.get('theta_hash',''))" "$1" | sort
}
"$atoll" "${common[@]}" --run-dir "$out/reference" >"$out/reference.log" 2>&1
rows "$out/reference/metrics.jsonl" >"$out/reference.rows"
RANDOM=$seed
wheres=(copy tensor part manifest rename latest)
failed=0; with_latest=0
for i in $(seq 1 "$points"); do
  where=${wheres[$((RANDOM % 6))]}; save=$((1 + RANDOM % 4)); island=0; rank=0
  if [ "$where" = copy ] || [ "$where" = tensor ] || [ "$where" = part ]; then island=$((RANDOM % 2)); rank=$((RANDOM % 2)); fi
  spec="crash:island=$island:rank=$rank:ckpt=$where:save=$save"
  run=$out/run; rm -rf "$run"
  if ATOLL_FAULT=$spec "$atoll" "${common[@]}" --run-dir "$run" >"$out/crash.log" 2>&1; then
    echo "point $i $spec: the run was not killed"; failed=$((failed + 1)); continue
  fi
  done_step=$((2 * (save - 1)))
  allowed="$done_step"
  case $where in
    latest) allowed=$((2 * save)) ;;
    copy|tensor|part) allowed="$done_step $((done_step - 2))" ;;
  esac
  latest=0
  if [ -s "$run/checkpoints/latest" ]; then
    name=$(head -1 "$run/checkpoints/latest"); latest=$((10#${name#step-}))
    if ! "$atoll" eval --checkpoint "$run/checkpoints/$name" >"$out/eval.log" 2>&1; then
      echo "point $i $spec: latest $name does not load: $(tail -1 "$out/eval.log")"; failed=$((failed + 1)); continue
    fi
    with_latest=$((with_latest + 1))
  fi
  ok=0; for a in $allowed; do [ $latest -eq $(( a > 0 ? a : 0 )) ] && ok=1; done
  if [ $ok -ne 1 ]; then echo "point $i $spec: latest is step $latest, expected one of: $allowed"; failed=$((failed + 1)); continue; fi
  if ! "$atoll" "${common[@]}" --run-dir "$run" --resume >"$out/resume.log" 2>&1; then
    echo "point $i $spec: resume fails: $(tail -1 "$out/resume.log")"; failed=$((failed + 1)); continue
  fi
  if ! cmp -s <(rows "$run/metrics.jsonl") "$out/reference.rows"; then
    echo "point $i $spec: the resumed run differs from the uninterrupted one"; failed=$((failed + 1)); continue
  fi
  if ls -d "$run"/checkpoints/*.tmp-* >/dev/null 2>&1; then
    echo "point $i $spec: a temporary directory was left behind"; failed=$((failed + 1)); continue
  fi
done
echo "ckpt_crash_loop: $points points (seed $seed), $((points - failed)) passed, $failed failed;" \
     "$with_latest left a committed latest (the others crashed before the first commit)"
[ $failed -eq 0 ]
