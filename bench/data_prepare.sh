#!/usr/bin/env bash
# `atoll data prepare` at scale (issue 22): corpora of SIZES gigabytes of JSONL generated from
# text already on the machine (headers, Python sources, fortunes; documents shuffled by a seed),
# prepared with a fixed memory budget. Prints, per size: wall time, CPU time (user + system,
# which a loaded machine distorts far less than wall time), peak RSS, MB/s per core and per
# CPU-second, tokenizer training time and encoding speed. Usage: bench/data_prepare.sh [SIZES_GB...]
# (default 0.2 1 5); ATOLL=build/atoll, MEMORY_MB=2048, VOCAB=8192, WORK=/tmp/atoll-bench-data.
set -euo pipefail
cd "$(dirname "$0")/.."
ATOLL=${ATOLL:-build/atoll}
MEMORY_MB=${MEMORY_MB:-2048}
VOCAB=${VOCAB:-8192}
WORK=${WORK:-/tmp/atoll-bench-data}
mkdir -p "$WORK"
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=(0.2 1 5)
cores=$(nproc)
echo "| corpus | wall s | CPU s | peak RSS MB | MB/s per core | MB per CPU-s | tokenizer s | tokens | M tokens/s encoding |"
echo "|---|---|---|---|---|---|---|---|---|"
for gb in "${sizes[@]}"; do
  corpus=$WORK/corpus-$gb.jsonl
  [ -f "$corpus" ] || /usr/bin/python3 - "$corpus" "$gb" <<'PY'
import json, os, random, sys
files = []
for root in ["/usr/include", "/usr/lib/python3.11", "/usr/lib/python3/dist-packages", "/usr/share/games/fortunes"]:
    for d, _, fs in os.walk(root):
        files += [os.path.join(d, f) for f in fs if f.endswith((".h", ".py", ".txt", ".rst")) or "fortunes" in d]
random.Random(5).shuffle(files)
want, n = float(sys.argv[2]) * 1e9, 0
with open(sys.argv[1], "w") as out:
    while n < want:
        for p in files:
            try: t = open(p, errors="replace").read()
            except Exception: continue
            if t.strip():
                out.write(json.dumps({"text": t}) + "\n"); n += len(t)
            if n >= want: break
PY
  rm -rf "$WORK/d-$gb"
  /usr/bin/time -v "$ATOLL" data prepare --input "$corpus" --out "$WORK/d-$gb" --vocab-size "$VOCAB" \
    --memory-mb "$MEMORY_MB" >"$WORK/log-$gb.out" 2>"$WORK/log-$gb.err"
  secs=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/log-$gb.err" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; ++i) s = s * 60 + $i; print s }')
  cpu=$(sed -n 's/.*\(User\|System\) time (seconds): //p' "$WORK/log-$gb.err" | awk '{ s += $1 } END { print s }')
  rss=$(( $(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/log-$gb.err") / 1024 ))
  tok_s=$(sed -n 's/.*tokenizer trained in \([0-9.]*\) s.*/\1/p' "$WORK/log-$gb.err")
  enc=$(sed -n 's/.*tokens encoded and written in \([0-9.]*\) s.*/\1/p' "$WORK/log-$gb.err")
  tokens=$(/usr/bin/python3 -c "import json; m = json.load(open('$WORK/d-$gb/meta.json')); print(m['train_tokens'] + m['val_tokens'])")
  bytes=$(stat -c %s "$corpus")
  awk -v gb="$gb" -v s="$secs" -v r="$rss" -v b="$bytes" -v c="$cores" -v t="$tok_s" -v n="$tokens" -v e="$enc" \
    -v u="$cpu" 'BEGIN { printf "| %s GB | %.0f | %.0f | %d | %.2f | %.2f | %.0f | %d | %.2f |\n", gb, s, u, r, b / 1e6 / s / c,
                         b / 1e6 / u, t, n, n / 1e6 / e }'
done
