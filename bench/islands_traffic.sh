#!/usr/bin/env bash
# Bytes sent per trained token: DiLoCo (4 islands, H = 100 and 500, codecs fp32/int8/int4)
# against synchronous data parallel (1 island of 4 workers), same binary, same config, same
# steps and tokens. comm_bytes (metrics.jsonl) is what each process handed to the network;
# the figure is the sum over the 4 processes at the end, divided by the run's tokens.
#   bench/islands_traffic.sh [STEPS] [--set k=v ...]     (default 500 steps of configs/tiny.toml)
# Bytes depend on the parameter count and the schedule, not on timing, so the batch is cut to
# one sequence per worker to keep the runs short; the ratio does not depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-500}
shift || true
atoll=${ATOLL:-build/atoll}
out=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-traffic}
rm -rf "$out"
mkdir -p "$out"
common=(--config configs/tiny.toml --set train.steps="$steps" --set train.batch_size=1 --set train.eval_every=0
        --set checkpoint.every=0 --set train.log_every=50 "$@")
run() {  # name, launch args...
  local name=$1
  shift
  "$atoll" launch "${common[@]}" --run-dir "$out/$name" "$@" >"$out/$name.log" 2>&1 ||
    { echo "$name failed:" >&2; tail -3 "$out/$name.log" >&2; exit 1; }
  echo "$name done" >&2
}
run ddp --islands 1 --workers-per-island 4
for h in 100 500; do
  for codec in fp32 int8 int4; do
    run "diloco-h$h-$codec" --islands 4 --set diloco.inner_steps=$h --set diloco.codec=$codec
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def traffic(name):
    last, tokens = {}, 0
    for line in open(os.path.join(out, name, "metrics.jsonl")):
        r = json.loads(line)
        if "comm_bytes" in r:
            last[(r.get("island"), r.get("rank"))] = r["comm_bytes"]
            tokens = max(tokens, r["tokens"])
    return sum(last.values()), tokens, len(last)
b, t, w = traffic("ddp")
ddp = b / t
print(f"| run | processes | bytes sent | tokens | bytes per token | less than data parallel |")
print(f"|---|---:|---:|---:|---:|---:|")
print(f"| data parallel, 1 island x 4 workers | {w} | {b:,} | {t:,} | {ddp:.1f} | 1x |")
for h in (100, 500):
    for codec in ("fp32", "int8", "int4"):
        b, t, w = traffic(f"diloco-h{h}-{codec}")
        print(f"| DiLoCo 4 islands, H={h}, {codec} | {w} | {b:,} | {t:,} | {b / t:.3f} | {ddp / (b / t):.0f}x |")
PY
