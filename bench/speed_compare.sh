#!/usr/bin/env bash
# `atoll bench` of two trees side by side in one session: a reference revision's binary and this
# tree's build/atoll, alternating per round (ref fp32, new fp32, ref bf16, new bf16, ...) so a
# drifting machine load hits both alike. Prints the median tokens/s of each and the ratio, and
# the same from each side's best step (the least disturbed by other load on a shared host).
#   bench/speed_compare.sh REV [CONFIG] [ROUNDS]     # e.g. bench/speed_compare.sh ddac503 small 3
# The reference binary is built as bench/identity.sh builds it (shared folder $OUT/ref-<sha>).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/speed_compare.sh REV [CONFIG] [ROUNDS]}
name=${2:-small} rounds=${3:-3}
out=${ATOLL_IDENTITY_OUT:-/tmp/atoll-identity}
sha=$(git rev-parse --short=12 "$rev")
ref=$out/ref-$sha
if [ ! -x "$ref/build/atoll" ]; then
  mkdir -p "$out"; rm -rf "$ref"; git worktree prune
  git worktree add --detach "$ref" "$sha" >/dev/null
  cmake -S "$ref" -B "$ref/build" -DCMAKE_BUILD_TYPE=Release -DATOLL_BUILD_TESTS=OFF -DATOLL_BUILD_BENCH=OFF \
    ${ATOLL_CMAKE_ARGS:-} >/dev/null
  cmake --build "$ref/build" -j"$(nproc)" --target atoll >/dev/null
fi
results=$out/speed-$sha.jsonl
: >"$results"
for r in $(seq 1 "$rounds"); do
  for prec in fp32 bf16; do
    for who in ref new; do
      bin=$([ $who = ref ] && echo "$ref/build/atoll" || echo build/atoll)
      line=$("$bin" bench --config "configs/$name.toml" --steps 3 --set train.precision=$prec 2>/dev/null | grep '^{' | tail -1)
      echo "{\"who\": \"$who\", \"precision\": \"$prec\", \"round\": $r, \"result\": $line}" >>"$results"
    done
  done
  echo "round $r done" >&2
done
python3 - "$results" "$sha" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"| precision | ref {sys.argv[2]} tokens/s (median; runs) | this tree tokens/s (median; runs) | ratio | ratio of best steps |")
print("|---|---|---|---:|---:|")
for prec in ("fp32", "bf16"):
    t = {w: [r["result"]["tokens_per_s"] for r in rows if r["who"] == w and r["precision"] == prec] for w in ("ref", "new")}
    m = {w: statistics.median(v) for w, v in t.items()}
    runs = {w: ", ".join(f"{x:.0f}" for x in v) for w, v in t.items()}
    best = {w: min(r["result"]["step_s_min"] for r in rows if r["who"] == w and r["precision"] == prec)
            for w in ("ref", "new")}
    print(f"| {prec} | {m['ref']:.0f} ({runs['ref']}) | {m['new']:.0f} ({runs['new']}) | {m['new'] / m['ref']:.3f} | "
          f"{best['ref'] / best['new']:.3f} |")
PY
