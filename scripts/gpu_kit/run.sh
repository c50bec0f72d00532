#!/usr/bin/env bash
# gpu-kit/run.sh: every GPU check of atoll in one call, on a machine that can install nothing
# (scripts/gpu_kit.sh builds the kit; README.md, "GPUs", says how to carry and run it).
#
#   OUT=/some/empty/folder gpu-kit/run.sh
#
# Parts, each under its own time limit so that a hang costs only its slice (seconds, overridable
# by the environment): 1 device (ATOLL_KIT_T_DEVICE, 20), 2 every GPU test binary (_T_TESTS,
# 110), 3 `atoll train` twins on cuda and on the CPU, with two islands through `atoll launch`
# beside them (_T_TWINS, 100), 4 `atoll bench` beside the PyTorch peer (_T_BENCH, 240). About
# 8 minutes in all. Without a GPU every GPU part reports a skip and the CPU twins still run.
# ATOLL_KIT_STEPS (50) sets the twins' steps.
#
# Needs only bash, coreutils, grep, sed, awk, tar and gzip (a minimal Debian has them; xz travels
# in unpack/ for a host without it), the
# CUDA toolkit's libraries for the GPU parts (found under /usr/local/cuda or in PyTorch's
# nvidia-* packages), and python3 with torch for the peer. Writes under $OUT: summary.json (every
# check), summary.md (the same as a table) and logs.tar.gz (every log, metrics.jsonl and gtest
# JSON report), rewritten after each part.
set -uo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
STEPS=${ATOLL_KIT_STEPS:-50}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atoll-kit.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS/tests" "$LOGS/runs" "$LOGS/bench"
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
T0=$SECONDS
source "$KIT/lib.sh"
# The binaries, libraries and test binaries travel packed (payload.tar.xz); they run from here.
# The host's xz if it has one, else the kit's own (unpack/: xz and its liblzma).
X=$WORK/unpacked
mkdir -p "$X"
unxz() { if command -v xz >/dev/null; then xz -dc "$@"; else LD_LIBRARY_PATH=$KIT/unpack "$KIT/unpack/xz" -dc "$@"; fi; }
unxz "$KIT/payload.tar.xz" | tar -C "$X" -xf - \
  || { echo "gpu kit: cannot unpack $KIT/payload.tar.xz into $X" >&2; exit 1; }

# --- the environment: the kit's libraries first, then the CUDA toolkit's ---------------------
libpath=$X/lib
if ! host_has_glibcxx "$(cat "$KIT/manifest/glibcxx_needed")"; then libpath=$libpath:$X/lib/compat; fi
cuda_libs=$(find_cuda_lib_dirs)
export LD_LIBRARY_PATH=$libpath${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$X/bin:$PATH ATOLL_BIN=$X/bin/atoll ATOLL_SOURCE_DIR=$KIT ATOLL_CACHE_DIR=$WORK/cache
export OMP_WAIT_POLICY=PASSIVE
cores=$(nproc)

# --- 1. the device, the toolkit, the driver ----------------------------------------------------
part_start device "${ATOLL_KIT_T_DEVICE:-20}"
{ echo "kit: $(cat "$KIT/manifest/commit")"; uname -a; echo "cores: $cores"; getconf GNU_LIBC_VERSION
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } >"$LOGS/device.log" 2>&1
glibc_needed=$(cat "$KIT/manifest/glibc_needed")
glibc_here=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if version_ge "$glibc_here" "$glibc_needed"; then
  record device glibc pass "glibc $glibc_here (the kit needs $glibc_needed)"
else
  record device glibc fail "glibc $glibc_here is older than the $glibc_needed the kit was built against; build the kit on an older Debian"
fi
loader=$(part_timeout 10 "$X/bin/atoll" --version 2>&1)
if [[ $? -eq 0 ]]; then record device atoll pass "$loader"; else record device atoll fail "$(head -1 <<<"$loader")"; fi
HAS_GPU=0
if command -v nvidia-smi >/dev/null && part_timeout 15 nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1; then
  gpu=$(part_timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  [[ -n "$gpu" ]] && HAS_GPU=1
  record device gpu pass "$gpu"
else
  record device gpu skip "no CUDA device: nvidia-smi $(command -v nvidia-smi >/dev/null && echo failed || echo 'not found')"
fi
nvcc_v=$( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>/dev/null' | tail -1)
if [[ -n "$nvcc_v" ]]; then record device toolkit pass "$nvcc_v; libraries from ${cuda_libs:-nowhere}"
else record device toolkit skip "no nvcc; libraries from ${cuda_libs:-nowhere}"; fi
write_summary

# --- 2. every GPU test binary ------------------------------------------------------------------
part_start tests "${ATOLL_KIT_T_TESTS:-110}"
run_test_binary() {  # one binary, its result per test into results
  local bin=$1 name; name=$(basename "$1")
  part_timeout "$(part_left)" "$bin" --gtest_output="json:$LOGS/tests/$name.json" >"$LOGS/tests/$name.log" 2>&1
  local rc=$? REC=$WORK/tests.$name.jsonl
  gtest_results "$name" "$rc" <"$LOGS/tests/$name.log"
}
jobs_max=$((cores >= 8 ? 4 : 2))
for bin in "$X"/tests/*_test; do
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n; done
  run_test_binary "$bin" &
done
wait
cat "$WORK"/tests.*.jsonl >>"$RESULTS" 2>/dev/null
write_summary

# --- 3. train twins (cuda beside cpu), and two islands on the GPU ------------------------------
part_start twins "${ATOLL_KIT_T_TWINS:-100}"
cpu_threads=$((cores / 4 > 0 ? cores / 4 : 1))
train_run() {  # NAME DEVICE CONFIG PRECISION
  local run=$WORK/runs/$1
  part_timeout "$(part_left)" "$X/bin/atoll" train --config "$KIT/configs/$3.toml" --run-dir "$run" --no-sample \
    --set data.dir="$KIT/data/fortunes-v4096" --set train.steps="$STEPS" --set train.log_every=1 \
    --set train.eval_every=0 --set checkpoint.every=0 --set train.device="$2" --set train.precision="$4" \
    --set train.threads="$cpu_threads" >"$LOGS/runs/$1.log" 2>&1
  local rc=$?
  cp "$run/metrics.jsonl" "$LOGS/runs/$1.metrics.jsonl" 2>/dev/null
  echo "$rc" >"$WORK/runs/$1.rc"
}
islands_run() {
  local run=$WORK/runs/islands device=cpu
  ((HAS_GPU)) && device=cuda
  part_timeout "$(part_left)" "$X/bin/atoll" launch --islands 2 --config "$KIT/configs/tiny.toml" --run-dir "$run" \
    --set data.dir="$KIT/data/fortunes-v4096" --set train.steps=20 --set diloco.inner_steps=5 \
    --set train.eval_every=0 --set checkpoint.every=0 --set train.device=$device --set train.threads="$cpu_threads" \
    >"$LOGS/runs/islands.log" 2>&1
  local rc=$?
  cp "$run/metrics.jsonl" "$LOGS/runs/islands.metrics.jsonl" 2>/dev/null
  cp "$run/events.jsonl" "$LOGS/runs/islands.events.jsonl" 2>/dev/null
  islands_result "$rc" "$device" "$run/metrics.jsonl"
}
mkdir -p "$WORK/runs"
twins=()
for cfg in tiny zaya1-tiny; do for prec in fp32 bf16; do twins+=("$cfg-$prec"); done; done
for t in "${twins[@]}"; do train_run "$t-cpu" cpu "${t%-*}" "${t##*-}" & done
islands_run &
if ((HAS_GPU)); then for t in "${twins[@]}"; do train_run "$t-cuda" cuda "${t%-*}" "${t##*-}"; done; fi
wait
for t in "${twins[@]}"; do twin_result "$t" "$HAS_GPU"; done
cat "$WORK/islands.jsonl" >>"$RESULTS"
write_summary

# --- 4. atoll bench beside the PyTorch peer on the same GPU ------------------------------------
part_start bench "${ATOLL_KIT_T_BENCH:-240}"
if ((HAS_GPU)); then
  for cfg in small medium; do for prec in fp32 bf16; do
    part_timeout "$(bench_slice 60)" "$X/bin/atoll" bench --config "$KIT/configs/$cfg.toml" --steps 5 --warmup 2 \
      --set train.device=cuda --set train.precision=$prec >"$LOGS/bench/atoll-$cfg-$prec.log" 2>&1
    bench_result "atoll $cfg $prec" $? "$LOGS/bench/atoll-$cfg-$prec.log" '^\{'
  done; done
  if [[ ! -f "$KIT/peer/ref_moe.py" ]]; then
    record bench pytorch skip "the kit was built without the PyTorch peer (../shared/peer)"
  elif python3 -c 'import torch' 2>/dev/null; then
    for mode in eager compile; do for cfg in small medium; do
      flag=(); [[ $mode == compile ]] && flag=(--compile)
      PYTHONUNBUFFERED=1 part_timeout "$(bench_slice 90)" python3 "$KIT/bench/peer_gpu.py" --peer "$KIT/peer" \
        --config $cfg --precision bf16 "${flag[@]}" >"$LOGS/bench/peer-$cfg-$mode.log" 2>&1
      bench_result "pytorch $cfg bf16 $mode" $? "$LOGS/bench/peer-$cfg-$mode.log" '^RESULT '
    done; done
  else
    record bench pytorch skip "python3 cannot import torch here"
  fi
  bench_ratios
else
  record bench atoll skip "no CUDA device: the benchmarks need one"
fi
write_summary
echo "gpu kit: done in $((SECONDS - T0)) s; $(summary_counts); results in $OUT"
