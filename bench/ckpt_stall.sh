#!/usr/bin/env bash
# Checkpoint stall (issue 20): how long a training step is blocked by a checkpoint save, and the
# full write time, in a small 2-island x 2-worker run, against a reference revision's save (the
# synchronous single-writer save this tree replaced: worker 0 gathered every island's state and
# wrote it alone, inside the step).
#   bench/ckpt_stall.sh REV [STEPS] [EVERY]     # default 60 steps, a save every 5
#   CONFIG=configs/small.toml bench/ckpt_stall.sh REV 20 5   # the issue's config (default tiny)
#   RUNS=new bench/ckpt_stall.sh REV ...   # this tree alone (the reference measured before on this machine)
# The reference is built once into $OUT/ref-<sha>/build (a git worktree, as bench/identity.sh
# does). Both runs: $CONFIG (configs/tiny.toml), 2 x 2, diloco.inner_steps 5, train.threads 1.
# Stall: this tree's rows carry ckpt_stall_s (the saving step blocked: the plan, plus any wait
# for the previous save) and, on the next row, ckpt_fence_s (that step waited at its fence for
# the background copy of the saved tensors); a save's stall is their sum. For both trees it is
# also measured from the rows' time_s as the extra time of a step that saves over the median step
# (the save shows in the next row's time: a row's time_s is taken before its step's save; the
# fence wait and any slowdown of the step by the copy running beside it show there too). Write:
# ckpt_write_s (background copy and write, part + commit).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/ckpt_stall.sh REV [STEPS] [EVERY]}
steps=${2:-60}
every=${3:-5}
out=${ATOLL_IDENTITY_OUT:-/tmp/atoll-identity}
sha=$(git rev-parse --short=12 "$rev")
ref=$out/ref-$sha
mkdir -p "$out"
exec 9>"$out/.ref-build.lock"; flock 9
if [ ! -x "$ref/build/atoll" ]; then
  rm -rf "$ref"; git worktree prune
  git worktree add --detach "$ref" "$sha" >/dev/null
  cmake -S "$ref" -B "$ref/build" -DCMAKE_BUILD_TYPE=Release -DATOLL_BUILD_TESTS=OFF -DATOLL_BUILD_BENCH=OFF \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache ${ATOLL_CMAKE_ARGS:-} >/dev/null
  cmake --build "$ref/build" -j2 --target atoll >/dev/null
fi
flock -u 9
new=$(pwd)/build/atoll
runs=/tmp/atoll-ckpt-stall
rm -rf "$runs"; mkdir -p "$runs"
for which in ${RUNS:-ref new}; do
  bin=$new; [ $which = ref ] && bin=$ref/build/atoll
  "$bin" launch --islands 2 --workers-per-island 2 --config "${CONFIG:-configs/tiny.toml}" --set train.steps="$steps" \
    --set train.eval_every=0 --set train.threads=1 --set diloco.inner_steps=5 --set checkpoint.every="$every" \
    --set checkpoint.keep=2 --run-dir "$runs/$which" >"$runs/$which.log" 2>&1
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
python3 - "$runs" "$every" "$steps" "${RUNS:-ref new}" <<'PY'
import json, statistics, sys
runs, every, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(which):
    r = {}
    for line in open(f"{runs}/{which}/metrics.jsonl"):
        o = json.loads(line)
        r.setdefault((o["island"], o["rank"]), {})[o["step"]] = o
    return r
for which in sys.argv[4].split():
    extra, step_s, stall, write = [], [], [], []
    for worker, by_step in rows(which).items():
        dt = {s: by_step[s]["time_s"] - by_step[s - 1]["time_s"] for s in by_step if s - 1 in by_step}
        saving = {s for s in dt if s % every == 0 and s < steps}
        after = {s + 1 for s in saving}  # a row's time_s is taken before its step's save
        plain = [v for s, v in dt.items() if s not in saving and s not in {x + 1 for x in saving}]
        med = statistics.median(plain)
        step_s.append(med)
        extra += [dt[s] - med for s in after if s in dt]
        stall += [o["ckpt_stall_s"] + by_step.get(o["step"] + 1, {}).get("ckpt_fence_s", 0)
                  for o in by_step.values() if "ckpt_stall_s" in o and o["step"] < steps]
        write += [o["ckpt_write_s"] for o in by_step.values() if "ckpt_write_s" in o]
    line = f"{which}: median step {statistics.median(step_s)*1e3:.1f} ms; extra time of a saving step " \
           f"{statistics.median(extra)*1e3:.1f} ms (median over {len(extra)} worker-saves)"
    if stall:
        line += f"; stall (ckpt_stall_s + next ckpt_fence_s) median {statistics.median(stall)*1e3:.2f} ms, max {max(stall)*1e3:.2f} ms " \
                f"({100*statistics.median(stall)/statistics.median(step_s):.2f}% of a step)"
    if write:
        line += f"; ckpt_write_s median {statistics.median(write)*1e3:.1f} ms"
    print(line)
PY
