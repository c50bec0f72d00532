#!/usr/bin/env bash
# GPU builds for CI, neither of which needs a GPU:
#   1. CUDA: configure build-cuda with ATOLL_WITH_CUDA=ON (Release), build the kernels (part
#      atoll_cuda, for ATOLL_CUDA_ARCHS, default 90: the Hopper GPUs the project is lent), their
#      tests and the `atoll` binary (train.device = cuda), and run the tests (each skips, with
#      the reason, when no CUDA device is present). The host code targets x86-64-v3 (AVX2, FMA),
#      not this machine's CPU, because this build is also what the GPU kit carries to another
#      machine (scripts/gpu_kit.sh). Skipped with a message when there is no nvcc.
#   2. HIP: install Debian's hipcc and libamdhip64-dev if missing, configure build-hip with
#      ATOLL_WITH_HIP=ON and compile every kernel for AMD (target atoll_hip, gfx90a).
# Usage: scripts/build_gpu.sh [all|cuda|hip]   (JOBS=N to set build parallelism; default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=${JOBS:-$(nproc)}
start=$SECONDS

build_cuda() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  if [[ -z "$nvcc" ]]; then
    echo "build_gpu: CUDA skipping: nvcc not found (not on PATH, not at /usr/local/cuda/bin)"
    return 0
  fi
  echo "build_gpu: CUDA with $nvcc"
  source scripts/ccache_env.sh
  cmake -S . -B build-cuda -DATOLL_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DATOLL_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=Release -DATOLL_ARCH=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES="${ATOLL_CUDA_ARCHS:-90}" \
    "${ATOLL_CCACHE_ARGS[@]}" >/dev/null
  local targets=(atoll_cuda atoll)
  for f in tests/backend_cuda/*_test.cpp; do targets+=("backend_cuda_$(basename "$f" .cpp)"); done
  cmake --build build-cuda -j"$jobs" --target "${targets[@]}"
  # Say plainly whether the kernels ran or only compiled. Without a device every test skips:
  # run them all (each must start and skip cleanly) but keep ctest's output to a line, so
  # a log never reads as if these were the suite.
  local probe
  probe=$(build-cuda/tests/backend_cuda/backend_cuda_swiglu_test 2>&1 | grep -m1 'no CUDA device' || true)
  if [[ -n "$probe" ]]; then
    ctest --test-dir build-cuda -R '^backend_cuda_' -Q || ctest --test-dir build-cuda -R '^backend_cuda_' --output-on-failure
    echo "build_gpu: CUDA tests compiled, started and SKIPPED:${probe#*]}"
  else
    ctest --test-dir build-cuda -R '^backend_cuda_' --output-on-failure
  fi
}

build_hip() {
  if ! command -v hipcc >/dev/null || [[ ! -f /usr/include/hip/hip_runtime.h ]]; then
    echo "build_gpu: HIP installing hipcc libamdhip64-dev"
    local sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null ||
      { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null; }
  fi
  echo "build_gpu: HIP with $(command -v hipcc)"
  cmake -S . -B build-hip -DATOLL_WITH_HIP=ON -DATOLL_BUILD_TESTS=OFF -DATOLL_BUILD_BENCH=OFF >/dev/null
  cmake --build build-hip -j"$jobs" --target atoll_hip
}

case "$what" in
  all) build_cuda; build_hip ;;
  cuda) build_cuda ;;
  hip) build_hip ;;
  *) echo "usage: $0 [all|cuda|hip]" >&2; exit 2 ;;
esac
echo "build_gpu: done in $((SECONDS - start)) s"
