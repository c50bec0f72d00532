#!/usr/bin/env bash
# Installs what atoll needs from Debian's packages (only what is missing) and builds it into
# build/ (Release). Safe to run again: it rebuilds only what changed. `--packages-only`: only the
# packages. ATOLL_CMAKE_ARGS adds CMake arguments (CI: the CUDA build, scripts/build_gpu.sh cuda-args).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake g++ make pkg-config git ccache
  libopenblas-openmp-dev libdnnl-dev libtomlplusplus-dev libcli11-dev libxxhash-dev libzstd-dev zlib1g-dev nlohmann-json3-dev
  libsentencepiece-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libhiredis-dev redis-server   # dist/: collectives, rendezvous store
  libsodium-dev       # dist/: sealed traffic between islands (dist/seal.h)
  libcpp-httplib-dev  # supervise/: the live view's HTTP server (atoll launch --status-port)
  fortunes            # the built-in default corpus (/usr/share/games/fortunes)
  python3             # acceptance and benchmark helpers
  python3-sentencepiece python3-numpy   # tests: the exported tokenizer against SentencePiece itself
  chromium            # tests: `atoll report` pages rendered headless (tests/cli/report_test.cc)
  slurm-wlm munge     # tests: a real one-host Slurm cluster (tests/slurm/one_host_slurm.sh)
)
source scripts/install_missing.sh
install_missing "${packages[@]}"
[[ "${1:-}" == --packages-only ]] && exit 0  # CI: fetch the rest while this compiles

build_type=${ATOLL_BUILD_TYPE:-Release}
source scripts/ccache_env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE="$build_type" "${ATOLL_CCACHE_ARGS[@]}" ${ATOLL_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: built build/atoll ($build_type)"
