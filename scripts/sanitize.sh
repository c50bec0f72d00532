#!/usr/bin/env bash
# The unit tests of the fast parts under sanitizers, built with clang (after scripts/setup.sh,
# which installs the rest of what atoll needs):
#   scripts/sanitize.sh          ASan + UBSan (build-asan): core, layers, model, optim, config,
#                                data, ckpt, dist, train unit tests and the fuzz targets' replay;
#                                the same build holds the fuzz targets (scripts/fuzz.sh)
#   scripts/sanitize.sh ci       the same build, a shorter list for CI's budget: the parsers'
#                                tests, the ring, the checkpoint writer and the fuzz replay
#   scripts/sanitize.sh thread   TSan (build-tsan): the threaded parts: dist/ (collectives, the
#                                store, membership, the liveness watch), ckpt/'s background writer
# Any report stops its test (halt_on_error) and the script exits non-zero. ATOLL_SANITIZE_TESTS
# (test executable names, space-separated) replaces the list below.
#   scripts/sanitize.sh packages only install the clang packages (CI fetches them early)
#   scripts/sanitize.sh MODE build|run   only build, or only run (CI builds in the background)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-address}
stage=${2:-all}
source scripts/install_missing.sh
install_missing clang libclang-rt-14-dev libomp-14-dev
[[ "$mode" == packages ]] && exit 0
source scripts/ccache_env.sh

case "$mode" in
  address | ci)
    build=build-asan
    cmake_args=(-DATOLL_FUZZ=ON)
    # Fast, single-process or few-process tests; the long end-to-end cli_ tests stay in the
    # normal build. Chosen for what ASan/UBSan can find: byte parsers, buffers, kernels.
    tests=(core_fault_injection_test config_config_test config_config_ranges_test config_data_mix_test
      layers_attention_test layers_moe_dispatch_test layers_router_test layers_cross_entropy_test
      model_layout_test model_decoder_test optim_adamw_test optim_muon_test optim_zero_shard_test
      data_shard_test data_loader_test data_jsonl_text_test data_mixture_loader_test
      ckpt_safetensors_test ckpt_checkpoint_test ckpt_sharded_checkpoint_test ckpt_background_writer_test
      dist_codec_test dist_ring_allreduce_test dist_membership_test dist_store_test
      train_state_registry_test train_run_lock_test fuzz_replay_test)
    [ "$mode" = ci ] && tests=(config_config_test data_shard_test data_loader_test ckpt_safetensors_test
      ckpt_checkpoint_test ckpt_background_writer_test dist_codec_test dist_ring_allreduce_test
      dist_membership_records_test train_state_transfer_messages_test fuzz_replay_test)
    # halt_on_error: the first report ends the test; leaks are reported at exit.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    ;;
  thread)
    build=build-tsan
    cmake_args=(-DATOLL_TSAN=ON)
    tests=(dist_group_test dist_group_lost_member_test dist_ring_allreduce_test dist_membership_test
      dist_store_test dist_streaming_test ckpt_background_writer_test)
    # The OpenMP runtime and OpenBLAS are not instrumented: their own synchronisation is
    # invisible to TSan (scripts/tsan.supp).
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
    ;;
  *)
    echo "usage: scripts/sanitize.sh [address|ci|thread]" >&2
    exit 2
    ;;
esac
if [ -n "${ATOLL_SANITIZE_TESTS:-}" ]; then read -r -a tests <<<"$ATOLL_SANITIZE_TESTS"; fi

# Warnings are errors in the GCC build; clang's extra ones are not made fatal here.
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATOLL_WERROR=OFF -DATOLL_BUILD_BENCH=OFF \
  "${cmake_args[@]}" "${ATOLL_CCACHE_ARGS[@]}" >/dev/null
start=$SECONDS
cmake --build "$build" -j"$(nproc)" --target "${tests[@]}" >"$build/sanitize-build.log" 2>&1 ||
  { tail -40 "$build/sanitize-build.log"; exit 1; }
echo "sanitize ($mode): built ${#tests[@]} tests in $((SECONDS - start)) s"
[[ "$stage" == build ]] && exit 0

failed=()
for t in "${tests[@]}"; do
  t0=$SECONDS
  if ATOLL_SOURCE_DIR=$PWD "$build/tests/$t" --gtest_brief=1 >"$build/$t.log" 2>&1; then
    echo "  ok    $t ($((SECONDS - t0)) s)"
  else
    echo "  FAIL  $t ($((SECONDS - t0)) s): $build/$t.log"
    tail -30 "$build/$t.log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "sanitize ($mode): ${#failed[@]} of ${#tests[@]} failed: ${failed[*]}"
  exit 1
fi
echo "sanitize ($mode): all ${#tests[@]} passed ($((SECONDS - start)) s in all)"
