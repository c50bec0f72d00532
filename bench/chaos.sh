#!/usr/bin/env bash
# Seeded chaos at scale (issue 19): the ctest cli_chaos_test (4 islands on the micro model; random
# SIGKILLs and SIGSTOP/SIGCONT hangs of workers drawn from a seed, plus ATOLL_FAULT kills in the
# ring and in a state transfer and a hang in the ring) with many more events and a longer run,
# and the same pass criteria: no outer step waits more than 2 x fault.timeout_s per failure in
# the wait, exit 0, equal θ hashes on every island, final validation loss within 2% of the fault-free run, no process left.
# Then the incidents tallied from the run's events.jsonl.
#   bench/chaos.sh [EVENTS] [SEED] [STEPS]     # default 1000 events, seed 19, 40 steps per event
# The run's directory, events.jsonl and chaos.log (the events drawn) are kept in $ATOLL_CHAOS_OUT
# (default /tmp/atoll-chaos). Needs a build (build/atoll, build/tests/cli_chaos_test).
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-1000}
seed=${2:-19}
steps=${3:-$((events * 40))}
out=${ATOLL_CHAOS_OUT:-/tmp/atoll-chaos}
rm -rf "$out"; mkdir -p "$out"
echo "chaos: $events events, seed $seed, $steps steps; load $(cut -d' ' -f1-3 /proc/loadavg); output in $out"
start=$(date +%s)
rc=0
ATOLL_BIN=$(pwd)/build/atoll ATOLL_SOURCE_DIR=$(pwd) ATOLL_CHAOS_EVENTS=$events ATOLL_CHAOS_SEED=$seed \
  ATOLL_CHAOS_STEPS=$steps ATOLL_CHAOS_KEEP=$out/run \
  build/tests/cli_chaos_test --gtest_filter='Chaos.*' >"$out/test.log" 2>&1 || rc=$?
echo "test: exit $rc after $(( $(date +%s) - start )) s (log: $out/test.log)"
grep -E "Failure|Expected|actual|val_loss|left behind|waited|median" "$out/test.log" | head -20 || true
[ -f "$out/run/events.jsonl" ] || { echo "no events.jsonl kept (the test stopped before the end)"; exit 1; }
python3 - "$out/run" <<'PY'
import collections, json, sys
run = sys.argv[1]
events = [json.loads(l) for l in open(run + "/events.jsonl") if l.strip()]
kinds = collections.Counter(e.get("event") for e in events)
print("incidents in events.jsonl: " + ", ".join(f"{k} {kinds[k]}" for k in sorted(kinds)))
print(open(run + "/chaos.log").readline().strip())
PY
exit $rc
