#!/usr/bin/env bash
# The fuzz targets of tests/fuzz for longer than CI gives them (scripts/fuzz.sh runs each ~15 s):
# every target for SECONDS_PER_TARGET (default 600), then a summary line per target: runs,
# corpus size reached, coverage (edges) and peak memory. Figures go to docs/benchmarks.md
# ("Fuzzing: long runs"). The corpus grown here stays in build-asan/fuzz/<target>/corpus; copy an
# input worth keeping (small, new coverage) into tests/fuzz/corpus/<target>/ by hand.
#   bench/fuzz_long.sh [SECONDS_PER_TARGET] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
scripts/fuzz.sh "$seconds" "$@"
printf "%-16s %12s %8s %8s %8s\n" target runs corpus edges rss_mb
for log in build-asan/fuzz/*/fuzz.log; do
  t=$(basename "$(dirname "$log")")
  runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$log" | grep -o "[0-9]*$")
  rss=$(grep -o "stat::peak_rss_mb: *[0-9]*" "$log" | grep -o "[0-9]*$")
  last=$(grep -E "^#[0-9]+" "$log" | tail -1)
  edges=$(grep -o "cov: [0-9]*" <<<"$last" | grep -o "[0-9]*")
  corpus=$(grep -o "corp: [0-9]*" <<<"$last" | grep -o "[0-9]*")
  printf "%-16s %12s %8s %8s %8s\n" "$t" "$runs" "$corpus" "$edges" "$rss"
done
