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
#        scripts/build_gpu.sh hip-packages     only install the HIP packages (CI fetches them early)
#        scripts/build_gpu.sh cuda-args        print the CMake arguments of the CUDA build (empty
#                                              without nvcc); with ATOLL_CUDA_BUILD_DIR=build, the
#                                              `cuda` step uses a build/ configured with them instead
#                                              of its own build-cuda/ (CI: the host code compiled once)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=${JOBS:-$(nproc)}
start=$SECONDS

find_nvcc() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  echo "$nvcc"
}

# The CMake arguments of a CUDA build (also printed by `cuda-args`, so that CI configures build/
# itself as the CUDA build and compiles the host code once for the tests and the kit).
cuda_cmake_args() {
  echo "-DATOLL_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=$1 -DATOLL_ARCH=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES=${ATOLL_CUDA_ARCHS:-90}"
}

build_cuda() {
  local nvcc dir=${ATOLL_CUDA_BUILD_DIR:-build-cuda}
  nvcc=$(find_nvcc)
  if [[ -z "$nvcc" ]]; then
    echo "build_gpu: CUDA skipping: nvcc not found (not on PATH, not at /usr/local/cuda/bin)"
    return 0
  fi
  echo "build_gpu: CUDA with $nvcc in $dir"
  source scripts/ccache_env.sh
  if [[ "$dir" == build-cuda ]]; then
    # shellcheck disable=SC2046  # the arguments are words
    cmake -S . -B build-cuda $(cuda_cmake_args "$nvcc") -DATOLL_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
      "${ATOLL_CCACHE_ARGS[@]}" >/dev/null
  elif ! grep -q '^ATOLL_WITH_CUDA:BOOL=ON' "$dir/CMakeCache.txt" 2>/dev/null; then
    echo "build_gpu: $dir (ATOLL_CUDA_BUILD_DIR) is not configured with ATOLL_WITH_CUDA=ON; fix: configure it with \$(scripts/build_gpu.sh cuda-args)" >&2
    exit 2
  fi
  local targets=(atoll_cuda atoll)
  for f in tests/backend_cuda/*_test.cpp; do targets+=("backend_cuda_$(basename "$f" .cpp)"); done
  cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
  # Say plainly whether the kernels ran or only compiled. Without a device every test skips:
  # run them all (each must start and skip cleanly) but keep ctest's output to a line, so
  # a log never reads as if these were the suite.
  local probe
  probe=$("$dir"/tests/backend_cuda/backend_cuda_swiglu_test 2>&1 | grep -m1 'no CUDA device' || true)
  if [[ -n "$probe" ]]; then
    ctest --test-dir "$dir" -R '^backend_cuda_' -Q || ctest --test-dir "$dir" -R '^backend_cuda_' --output-on-failure
    echo "build_gpu: CUDA tests compiled, started and SKIPPED:${probe#*]}"
  else
    ctest --test-dir "$dir" -R '^backend_cuda_' --output-on-failure
  fi
}

install_hip() {
  source scripts/install_missing.sh
  install_missing hipcc libamdhip64-dev
}

build_hip() {
  install_hip
  echo "build_gpu: HIP with $(command -v hipcc)"
  source scripts/ccache_env.sh
  cmake -S . -B build-hip -DATOLL_WITH_HIP=ON -DATOLL_BUILD_TESTS=OFF -DATOLL_BUILD_BENCH=OFF \
    "${ATOLL_CCACHE_ARGS[@]}" >/dev/null
  cmake --build build-hip -j"$jobs" --target atoll_hip
}

case "$what" in
  all) build_cuda; build_hip ;;
  cuda) build_cuda ;;
  hip) build_hip ;;
  hip-packages) install_hip; exit 0 ;;
  cuda-args) nvcc=$(find_nvcc); [[ -z "$nvcc" ]] || cuda_cmake_args "$nvcc"; exit 0 ;;
  *) echo "usage: $0 [all|cuda|hip|hip-packages|cuda-args]" >&2; exit 2 ;;
esac
echo "build_gpu: done in $((SECONDS - start)) s"
