#!/usr/bin/env bash
# atoll against the PyTorch peer, side by side: the runs alternate (peer, atoll, peer, atoll,
# ...) so drifting machine load hits both alike. The peer is a plain PyTorch 1.13 (CPU, fp32)
# implementation of the same model, kept outside this repository; its bench_train.py times
# training steps on random tokens and ends with one line `RESULT {json}` (tokens_per_s, gflops,
# peak_rss_mib). It needs Debian's python3-torch and libopenblas0-pthread (without the latter
# torch falls back to the reference BLAS, ~25x slower).
#   ATOLL_PEER_DIR=DIR bench/vs_pytorch.sh small 3     # the peer's folder; config (tiny|small), rounds
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-small} rounds=${2:-3}
peer_dir=${ATOLL_PEER_DIR:?set ATOLL_PEER_DIR to the folder of the PyTorch peer (the one holding bench_train.py)}
[ -f "$peer_dir/bench_train.py" ] || { echo "vs_pytorch: no bench_train.py in ATOLL_PEER_DIR=$peer_dir" >&2; exit 1; }
peer_dir=$(cd "$peer_dir" && pwd)
out=${ATOLL_BENCH_OUT:-/tmp/atoll-vs-pytorch}
mkdir -p "$out"
: >"$out/results.jsonl"
atoll=${ATOLL:-build/atoll}
for r in $(seq 1 "$rounds"); do
  for who in pytorch-default pytorch-passive atoll-fp32 atoll-bf16; do
    case $who in
      pytorch-default) line=$(cd "$peer_dir" && /usr/bin/python3 bench_train.py --config "$name" --warmup 1 --steps 3 2>&1 | sed -n 's/^RESULT //p') ;;
      pytorch-passive) line=$(cd "$peer_dir" && OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench_train.py --config "$name" --warmup 1 --steps 3 2>&1 | sed -n 's/^RESULT //p') ;;
      atoll-fp32) line=$("$atoll" bench --config "configs/$name.toml" --steps 3 2>/dev/null | grep '^{' | tail -1) ;;
      atoll-bf16) line=$("$atoll" bench --config "configs/$name.toml" --steps 3 --set train.precision=bf16 2>/dev/null | grep '^{' | tail -1) ;;
    esac
    echo "{\"who\": \"$who\", \"round\": $r, \"result\": $line}" >>"$out/results.jsonl"
    echo "round $r $who done" >&2
  done
done
python3 - "$out/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows: by.setdefault(r["who"], []).append(r["result"])
best = statistics.median(x["tokens_per_s"] for x in by["pytorch-passive"])
print("| run | tokens/s min / median / max | GFLOP/s (median) | MFU | peak RSS MiB | vs PyTorch PASSIVE |")
print("|---|---|---:|---:|---:|---:|")
for who, rs in by.items():
    t = sorted(x["tokens_per_s"] for x in rs)
    g = statistics.median(x["gflops"] for x in rs)
    mfu = statistics.median(x.get("mfu", 0) for x in rs)
    rss = max(x["peak_rss_mib"] for x in rs)
    print(f"| {who} | {t[0]:.0f} / {statistics.median(t):.0f} / {t[-1]:.0f} | {g:.1f} | "
          f"{(f'{100*mfu:.0f}%' if mfu else '-')} | {rss:.0f} | {statistics.median(t)/best:.2f}x |")
PY
