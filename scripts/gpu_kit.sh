#!/usr/bin/env bash
# Builds gpu-kit/: everything a GPU machine that can install nothing needs to run every GPU check
# of atoll in one call (gpu-kit/run.sh; README.md, "GPUs"). Runs here, without a GPU:
#   1. the CUDA build (scripts/build_gpu.sh cuda: Release, sm_90, host code for x86-64-v3;
#      incremental), atoll and every GPU test binary;
#   2. gpu-kit/: the binaries (stripped), every shared library they load that is neither glibc
#      nor the CUDA driver or toolkit (read off the binaries with ldd, never a hand-kept list;
#      libstdc++ and libgcc_s apart in lib/compat/, used only where the host's are older),
#      redis-server with its own libraries, the configs, the built-in corpus prepared once
#      (data/), a copy of the PyTorch peer (../shared/peer) and bench/peer_gpu.py, run.sh, and
#      manifest/ (the commit, the glibc and GLIBCXX versions and CUDA libraries the binaries need);
#      bin/, lib/ and tests/ travel packed as payload.tar.xz (xz: half of gzip's size, since one
#      large window finds the code the test binaries share), with xz and its liblzma beside it
#      (unpack/, 0.3 MiB) for a host without xz (a minimal Debian has none);
#   3. checks its size: at most 48 MiB (ATOLL_KIT_MAX_MIB), so it travels in a 64 MiB tree.
# Usage: scripts/gpu_kit.sh   (ATOLL_PEER_DIR: the peer's folder, default ../shared/peer)
set -euo pipefail
cd "$(dirname "$0")/.."
max_mib=${ATOLL_KIT_MAX_MIB:-48}
peer=${ATOLL_PEER_DIR:-../shared/peer}
# Without the peer (a checkout without ../shared: CI, a user's clone) the kit is built without it
# and run.sh reports the PyTorch benchmarks as skipped.
if [[ ! -f "$peer/ref_moe.py" ]]; then
  echo "gpu_kit: warning: no PyTorch peer at $peer (ref_moe.py): the kit's benchmarks run without it; set ATOLL_PEER_DIR" >&2
  peer=""
fi
command -v redis-server >/dev/null || { echo "gpu_kit: no redis-server; fix: scripts/setup.sh installs it" >&2; exit 2; }

scripts/build_gpu.sh cuda
cuda_build=${ATOLL_CUDA_BUILD_DIR:-build-cuda}  # build/ in CI (scripts/build_gpu.sh cuda-args)
[[ -x $cuda_build/atoll ]] || { echo "gpu_kit: $cuda_build/atoll was not built (no nvcc?); the kit needs the CUDA build" >&2; exit 2; }

new=gpu-kit.new
rm -rf "$new"
mkdir -p "$new"/{bin,tests,lib/compat,configs,peer,bench,manifest,data}
cp "$cuda_build/atoll" "$new/bin/"
cp "$cuda_build"/tests/backend_cuda/backend_cuda_*_test "$new/tests/"
cp -L "$(command -v redis-server)" "$new/bin/redis-server"
strip --strip-unneeded "$new"/bin/atoll "$new"/tests/*
cp configs/*.toml "$new/configs/"
[[ -n "$peer" ]] && cp "$peer"/*.py "$peer"/README.md "$new/peer/"
cp bench/peer_gpu.py "$new/bench/"
cp scripts/gpu_kit/run.sh scripts/gpu_kit/lib.sh "$new/"

# The libraries, from the binaries themselves. glibc's own (libc, libm, the loader...) stay the
# host's, which must be at least as new as this one (manifest/glibc_needed, checked by run.sh).
# The CUDA toolkit's (runtime, cuBLAS, NCCL) and the driver's come from the GPU machine.
is_glibc() { [[ $1 =~ ^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libnsl|libanl|libthread_db|libnss_[a-z]+|ld-linux-x86-64)\.so ]]; }
is_cuda() { [[ $1 =~ ^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-ml|nvrtc|nvJitLink)\.so ]]; }
: >"$new/manifest/cuda_needed"
for bin in "$new"/bin/* "$new"/tests/*; do
  while read -r soname path; do
    [[ -z "$soname" ]] && continue
    if is_cuda "$soname"; then
      grep -qx "$soname" "$new/manifest/cuda_needed" || echo "$soname" >>"$new/manifest/cuda_needed"
    elif is_glibc "$soname"; then
      continue
    elif [[ "$path" == "not" || ! -e "$path" ]]; then
      echo "gpu_kit: $bin needs $soname, which is not found here; fix: scripts/setup.sh" >&2; exit 2
    elif [[ $soname =~ ^lib(stdc\+\+|gcc_s)\.so ]]; then
      cp -L "$path" "$new/lib/compat/$soname"
    else
      [[ -e "$new/lib/$soname" ]] || cp -L "$path" "$new/lib/$soname"
    fi
  done < <(ldd "$bin" | awk '$2 == "=>" { print $1, $3 }')
done
# cuBLAS is loaded at its first use (dlopen; backend/cuda/blas_library.cu), so ldd does not list
# it: its soname is read off the binary, where it is a literal; cuBLASLt comes with it.
for soname in $(grep -aohE 'libcublas\.so\.[0-9]+' "$new"/bin/atoll | sort -u); do
  for lib in "$soname" "${soname/libcublas/libcublasLt}"; do
    grep -qx "$lib" "$new/manifest/cuda_needed" || echo "$lib" >>"$new/manifest/cuda_needed"
  done
done
strip --strip-unneeded "$new"/lib/*.so* "$new"/lib/compat/*.so* 2>/dev/null || true

# What the host must provide: glibc and libstdc++ versions (the highest symbol version any binary
# or bundled library asks for), and the CUDA libraries' sonames.
objdump -T "$new"/bin/* "$new"/tests/* "$new"/lib/*.so* 2>/dev/null | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' \
  | sed 's/GLIBC_//' | sort -uV | tail -1 >"$new/manifest/glibc_needed"
objdump -T "$new"/bin/* "$new"/tests/* "$new"/lib/*.so* 2>/dev/null | grep -oE 'GLIBCXX_[0-9]+(\.[0-9]+)+' \
  | sed 's/GLIBCXX_//' | sort -uV | tail -1 >"$new/manifest/glibcxx_needed"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests scripts configs bench || echo '+changes') $(date -u +%F)" \
  >"$new/manifest/commit"

# The built-in corpus, prepared once (the GPU machine has no Debian fortunes): reused from the
# last kit when the tokenizer settings are the same.
if [[ -f gpu-kit/data/fortunes-v4096/meta.json ]]; then
  cp -a gpu-kit/data/fortunes-v4096 "$new/data/"
else
  "$cuda_build/atoll" data prepare --out "$new/data/fortunes-v4096" --vocab-size 4096 >/dev/null
fi

n_tests=$(ls "$new/tests" | wc -l)
n_libs=$(ls "$new/lib" "$new/lib/compat" | grep -c '\.so')
# Binaries and libraries travel packed (run.sh unpacks them into a temporary folder): the folder
# is what the size limit counts. xz -7 (16 MiB window): 22 MiB where gzip -9 made 43 (its 32 KiB
# window cannot see that 20 test binaries and atoll share most of their code).
command -v xz >/dev/null || { echo "gpu_kit: no xz; fix: sudo apt-get install xz-utils" >&2; exit 2; }
mkdir -p "$new/unpack"
cp -L "$(command -v xz)" "$new/unpack/xz"
cp -L "$(ldd "$(command -v xz)" | awk '$1 ~ /^liblzma/ { print $3 }')" "$new/unpack/"
tar -C "$new" -cf - bin lib tests | xz -7 -T0 >"$new/payload.tar.xz"
rm -rf "$new"/{bin,lib,tests}
rm -rf gpu-kit
mv "$new" gpu-kit
bytes=$(du -sb gpu-kit | cut -f1)
echo "gpu_kit: gpu-kit/ $((bytes / 1048576)) MiB ($n_tests GPU test binaries, $n_libs libraries; glibc >= $(cat gpu-kit/manifest/glibc_needed); CUDA: $(tr '\n' ' ' <gpu-kit/manifest/cuda_needed))"
if ((bytes > max_mib * 1048576)); then
  echo "gpu_kit: gpu-kit/ is $((bytes / 1048576)) MiB, over the $max_mib MiB it may take (the device tree travels at most 64 MiB)" >&2
  exit 1
fi
