#!/usr/bin/env bash
# gpu-kit/run.sh's readers (scripts/gpu_kit/lib.sh) on made-up inputs: gtest's console output
# (a pass, a failure with its message, a skip with its reason, a test cut off by a time limit, a
# binary that did not load), the twins' loss comparison against its bound, the islands' θ hashes,
# and the summary: valid JSON (python's json module as the independent reader), one table row
# per check. Registered with ctest (tests/CMakeLists.txt).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
KIT=$WORK/kit OUT=$WORK/out LOGS=$WORK/logs RESULTS=$WORK/results.jsonl STEPS=3 T0=$SECONDS HAS_GPU=1
mkdir -p "$KIT/manifest" "$OUT" "$LOGS/tests" "$LOGS/runs" "$WORK/runs"
echo "test-kit" >"$KIT/manifest/commit"
: >"$RESULTS"
source "$src/scripts/gpu_kit/lib.sh"
failures=0
expect() {  # DESCRIPTION PATTERN: a line of results.jsonl matches PATTERN
  if ! grep -qE -- "$2" "$RESULTS"; then echo "FAIL: $1 (no line matches $2)"; failures=$((failures + 1)); fi
}

gtest_results demo_test 124 <<'LOG' >/dev/null
[ RUN      ] Suite.Passes
[       OK ] Suite.Passes (3 ms)
[ RUN      ] Suite.Fails
/src/x_test.cpp:10: Failure
Expected equality of these values:
  a
[  FAILED  ] Suite.Fails (1 ms)
[ RUN      ] Suite.Skips
/src/x_test.cpp:20: Skipped
no CUDA device: cudaGetDeviceCount found 0 devices
[  SKIPPED ] Suite.Skips (0 ms)
[ RUN      ] Suite.Hangs
still working
LOG
expect "a pass" '"check":"demo_test.Suite.Passes","result":"pass"'
expect "a failure with its message" '"check":"demo_test.Suite.Fails","result":"fail","detail":"Expected equality of these values: / +a"'
expect "a skip with its reason" '"check":"demo_test.Suite.Skips","result":"skip","detail":"no CUDA device: cudaGetDeviceCount found 0 devices"'
expect "a test cut off by its time limit" '"check":"demo_test.Suite.Hangs","result":"fail","detail":"no result: the binary was stopped at its time limit'
echo "./demo: error while loading shared libraries: libx.so.1: cannot open shared object file" >"$LOGS/tests/noload_test.log"
gtest_results noload_test 127 <"$LOGS/tests/noload_test.log" >/dev/null
expect "a binary that did not load" '"check":"noload_test","result":"fail","detail":"exit 127 before any test: ./demo: error while loading shared libraries'

# Twins: fp32 within 1e-3 relative passes, a 1% difference fails; the CPU side's losses reported.
for run in tiny-fp32-cpu tiny-fp32-cuda zaya1-tiny-fp32-cpu zaya1-tiny-fp32-cuda; do mkdir -p "$WORK/runs/$run"; echo 0 >"$WORK/runs/$run.rc"; done
printf '{"step":1,"loss":8.0,"lr":1}\n{"step":2,"loss":7.0,"val_loss":9.5}\n{"step":3,"loss":6.0}\n' >"$WORK/runs/tiny-fp32-cpu/metrics.jsonl"
printf '{"step":1,"loss":8.0001}\n{"step":2,"loss":7.0}\n{"step":3,"loss":6.0}\n' >"$WORK/runs/tiny-fp32-cuda/metrics.jsonl"
cp "$WORK/runs/tiny-fp32-cpu/metrics.jsonl" "$WORK/runs/zaya1-tiny-fp32-cpu/"
printf '{"step":1,"loss":8.0}\n{"step":2,"loss":7.07}\n{"step":3,"loss":6.0}\n' >"$WORK/runs/zaya1-tiny-fp32-cuda/metrics.jsonl"
twin_result tiny-fp32 1 >/dev/null
twin_result zaya1-tiny-fp32 1 >/dev/null
expect "the CPU twin's losses" '"check":"cpu tiny-fp32","result":"pass","detail":"loss 8.0000 -> 6.0000 over 3 steps"'
expect "a twin within its bound" '"check":"cuda tiny-fp32","result":"pass","detail":"3 steps compared, max relative difference 1.25e-05 \(step 1\)'
expect "a twin outside its bound" '"check":"cuda zaya1-tiny-fp32","result":"fail","detail":"3 steps compared, max relative difference 0.01 \(step 2\)'

# Islands: equal hashes at every outer step pass; one split fails.
printf '{"island":0,"outer_step":%d,"theta_hash":"ab%d"}\n{"island":1,"outer_step":%d,"theta_hash":"ab%d"}\n' 1 1 1 1 2 2 2 2 3 3 3 3 4 4 4 4 >"$WORK/m.jsonl"
islands_result 0 cpu "$WORK/m.jsonl" >/dev/null
cat "$WORK/islands.jsonl" >>"$RESULTS"
expect "islands agreeing" '"check":"launch 2 islands \(cpu\)","result":"pass","detail":"2 islands on cpu, exit 0: 4 outer steps, 0 with differing'
echo '{"island":1,"outer_step":4,"theta_hash":"ff"}' >>"$WORK/m.jsonl"
rm "$WORK/islands.jsonl"
islands_result 0 cpu "$WORK/m.jsonl" >/dev/null
grep -q '"result":"fail","detail":"2 islands on cpu, exit 0: 4 outer steps, 1 with differing' "$WORK/islands.jsonl" \
  || { echo "FAIL: islands disagreeing at one outer step"; failures=$((failures + 1)); }

# A detail with quotes, a backslash, a tab, a pipe and a non-ASCII character stays valid JSON.
record device odd pass $'say "hi" \\ tab\there | θ' >/dev/null
write_summary
python3 - "$OUT/summary.json" "$OUT/summary.md" "$(wc -l <"$RESULTS")" <<'PY' || failures=$((failures + 1))
import json, sys
s = json.load(open(sys.argv[1], encoding="utf-8"))
rows = [l for l in open(sys.argv[2], encoding="utf-8") if l.startswith("| ") and not l.startswith("| part")]
n = int(sys.argv[3])
assert len(s["checks"]) == n, (len(s["checks"]), n)
assert len(rows) == n, (len(rows), n)
odd = [c for c in s["checks"] if c["check"] == "odd"][0]
assert odd["detail"] == 'say "hi" \\ tab\there | θ', odd["detail"]
assert "\\|" in rows[-1], rows[-1]
PY
[[ -s "$OUT/logs.tar.gz" ]] || { echo "FAIL: no logs.tar.gz"; failures=$((failures + 1)); }
if ((failures)); then echo "gpu_kit_lib_test: $failures failure(s)"; cat "$RESULTS"; exit 1; fi
echo "gpu_kit_lib_test: passed"
