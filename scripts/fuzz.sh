#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz (one per parser of bytes atoll did not write itself):
# builds them (clang, ASan + UBSan, into build-asan, the build scripts/sanitize.sh uses), then
# runs each over its committed corpus and regressions and fuzzes it for SECONDS_PER_TARGET
# (default 15; 0: the corpus only). New inputs go to a scratch corpus, not the committed one; a
# crash stops the script, leaving the input under build-asan/fuzz/<target>/: fix the parser,
# then keep the input as tests/fuzz/regressions/<target>/<name> (fuzz_replay_test replays it
# in every build).
#   scripts/fuzz.sh [SECONDS_PER_TARGET|build] [TARGET...]
# The seed corpora are atoll's own output: after a format changes, rewrite them with
#   build/tests/fuzz_make_seeds tests/fuzz/corpus   (or build-asan/tests/fuzz/fuzz_make_seeds)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-15}  # "build": only build the targets (CI builds them in the background)
shift || true
source scripts/install_missing.sh
install_missing clang libclang-rt-14-dev libomp-14-dev
source scripts/ccache_env.sh

build=build-asan
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATOLL_WERROR=OFF -DATOLL_BUILD_BENCH=OFF \
  -DATOLL_FUZZ=ON "${ATOLL_CCACHE_ARGS[@]}" >/dev/null
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/*_fuzz.cc; do
    n=${f##*/}
    targets+=("${n%_fuzz.cc}")
  done
fi
start=$SECONDS
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log"; exit 1; }
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - start)) s"
[[ "$seconds" == build ]] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
root=$PWD
limit=(-max_total_time="$seconds")
((seconds > 0)) || limit=(-runs=0)
for t in "${targets[@]}"; do
  work=$root/$build/fuzz/$t
  mkdir -p "$work/corpus"
  args=("$work/corpus" "$root/tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && args+=("$root/tests/fuzz/regressions/$t")
  [ -f "tests/fuzz/dict/$t.dict" ] && args+=(-dict="$root/tests/fuzz/dict/$t.dict")
  # -max_len keeps inputs near the seeds' size; -timeout flags an input that hangs a parser;
  # -rss_limit_mb one that makes it allocate without bound. Crash inputs land in $work.
  t0=$SECONDS
  if ! (cd "$work" && "$root/$build/tests/fuzz/fuzz_$t" "${args[@]}" "${limit[@]}" -max_len=16384 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 >fuzz.log 2>&1); then
    echo "fuzz: $t FAILED ($work/fuzz.log):"
    grep -E "ERROR|SUMMARY|Test unit written|==[0-9]+==" "$work/fuzz.log" | head -20
    exit 1
  fi
  runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$work/fuzz.log" | grep -o "[0-9]*$" || echo "?")
  echo "  ok    $t: $runs runs in $((SECONDS - t0)) s"
done
echo "fuzz: ${#targets[@]} targets, no crash ($((SECONDS - start)) s in all)"
