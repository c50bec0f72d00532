#!/usr/bin/env bash
# Resume time against state size (issue 20): from the start of an `atoll train --resume` process
# to its first training step (the first metrics.jsonl row after the checkpoint's step), for
# configs/tiny.toml, configs/small.toml and a larger one (small with 12 layers).
#   bench/resume_time.sh
# Each run: one step trained and saved (train.steps 1), then resumed to train.steps 2, batch 4,
# train.threads 2, no evaluation. The time to the first step includes that step; the step's own
# time (its row's time_s difference, printed) is subtracted to give the time before it: reading
# the config and data, allocating, verifying and loading the checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(pwd)/build/atoll
runs=/tmp/atoll-resume-time
rm -rf "$runs"; mkdir -p "$runs"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-14s %10s %12s %10s %12s\n' config state_MB to_first_s step_s before_step_s
for spec in "tiny:configs/tiny.toml:" "small:configs/small.toml:" "small-12L:configs/small.toml:model.n_layers=12"; do
  IFS=: read -r name cfg extra <<<"$spec"
  run=$runs/$name
  sets=(--set train.batch_size=4 --set train.eval_every=0 --set train.threads=2 --set train.log_every=1)
  [ -n "$extra" ] && sets+=(--set "$extra")
  "$bin" train --config "$cfg" --run-dir "$run" --no-sample --set train.steps=1 "${sets[@]}" >"$run.log" 2>&1
  state_mb=$(du -sm "$run/checkpoints/$(cat "$run/checkpoints/latest")" | cut -f1)
  t0=$(date +%s.%N)
  "$bin" train --resume --run-dir "$run" --no-sample --set train.steps=2 --set train.log_every=1 >>"$run.log" 2>&1 &
  pid=$!
  while [ "$(wc -l <"$run/metrics.jsonl")" -lt 2 ]; do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  t1=$(date +%s.%N)
  wait "$pid"
  python3 - "$run" "$name" "$state_mb" "$t0" "$t1" <<'PY'
import json, sys
run, name, mb, t0, t1 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
r = rows[-1]  # the resumed process's step: its tokens over its rate
step_s = (r["tokens"] - rows[-2]["tokens"]) / r["tokens_per_s"]
total = t1 - t0
print(f"{name:<14} {mb:>10} {total:>12.2f} {step_s:>10.2f} {total - step_s:>12.2f}")
PY
done
