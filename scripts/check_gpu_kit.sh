#!/usr/bin/env bash
# The GPU kit's closure check (.ci/run, after scripts/gpu_kit.sh): gpu-kit/run.sh inside a minimal
# Debian root (debootstrap --variant=minbase, Debian's own mirror as apt uses here; cached in
# $ATOLL_MINROOT, default ~/.cache/atoll/minroot) that holds none of atoll's Debian libraries,
# with this machine's CUDA toolkit mounted at its usual path, as the GPU machine has one. Fails
# unless every binary of the kit loads, every GPU test starts and reports its skip ("no CUDA
# device"), and the CPU twins and the two islands train. A library missing from the kit fails here.
# Usage: scripts/check_gpu_kit.sh   (ATOLL_KIT_STEPS: the twins' steps, default 10 here)
#        scripts/check_gpu_kit.sh --make-root   only make the minimal root (CI: while it compiles)
set -euo pipefail
cd "$(dirname "$0")/.."
make_root_only=0
[[ "${1:-}" == --make-root ]] && make_root_only=1
((make_root_only)) || [[ -x gpu-kit/run.sh ]] || { echo "check_gpu_kit: no gpu-kit/run.sh; fix: run scripts/gpu_kit.sh first" >&2; exit 2; }
sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
root=${ATOLL_MINROOT:-$HOME/.cache/atoll/minroot}
cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
[[ -d "$cuda/bin" ]] || { echo "check_gpu_kit: no CUDA toolkit at /usr/local/cuda to mount in" >&2; exit 2; }

if [[ ! -x "$root/bin/bash" ]]; then
  source scripts/install_missing.sh
  install_missing debootstrap
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n "$mirror" ]] || mirror=$(awk '/^deb /{ print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  echo "check_gpu_kit: debootstrap --variant=minbase bookworm $root ($mirror)"
  "${sudo[@]}" rm -rf "$root.new"
  "${sudo[@]}" debootstrap --variant=minbase bookworm "$root.new" "${mirror:-http://deb.debian.org/debian}" >/tmp/atoll-debootstrap.log 2>&1 \
    || { tail -5 /tmp/atoll-debootstrap.log >&2; exit 1; }
  "${sudo[@]}" mv "$root.new" "$root"
fi
((make_root_only)) && { echo "check_gpu_kit: minimal root ready in $root"; exit 0; }
for lib in libdnnl.so.2 libgloo.so.0 libhiredis.so.0.14 libsentencepiece.so.0 libopenblas.so.0 libgomp.so.1; do
  if [[ -n "$(find "$root/usr/lib" -name "$lib" 2>/dev/null | head -1)" ]]; then
    echo "check_gpu_kit: the minimal root holds $lib: not a fair check (remove $root to remake it)" >&2; exit 1
  fi
done

"${sudo[@]}" rm -rf "$root/kit" "$root/out"
"${sudo[@]}" mkdir -p "$root/out" "$root$cuda" "$root/proc" "$root/dev"
"${sudo[@]}" cp -a gpu-kit "$root/kit"
"${sudo[@]}" ln -sfn "$cuda" "$root/usr/local/cuda"
mounts=("$root/proc" "$root/dev" "$root$cuda")
cleanup() { for m in "${mounts[@]}"; do mountpoint -q "$m" && "${sudo[@]}" umount "$m"; done; }
trap cleanup EXIT
"${sudo[@]}" mount --bind /proc "$root/proc"
"${sudo[@]}" mount --bind /dev "$root/dev"
"${sudo[@]}" mount --bind -o ro "$cuda" "$root$cuda"
log=$(mktemp /tmp/atoll-kit-check.XXXXXX)
set +e
"${sudo[@]}" timeout 900 chroot "$root" /usr/bin/env -i PATH=/usr/local/cuda/bin:/usr/bin:/bin HOME=/tmp OUT=/out \
  ATOLL_KIT_STEPS="${ATOLL_KIT_STEPS:-10}" /bin/bash /kit/run.sh >"$log" 2>&1
rc=$?
set -e
cat "$log"
summary=$root/out/summary.json
fails=()
((rc == 0)) || fails+=("run.sh exited $rc")
[[ -s "$summary" ]] || fails+=("no summary.json under \$OUT")
if grep -qiE 'error while loading shared libraries|cannot open shared object|not found \(required by' "$log" "$summary" 2>/dev/null; then
  fails+=("a binary does not load: $(grep -hm1 -iE 'error while loading|cannot open shared|required by' "$log" "$summary")")
fi
n_tests=$(grep -c '"part":"tests"' "$summary" || true)
n_skip=$(grep '"part":"tests"' "$summary" | grep -c '"result":"skip","detail":"no CUDA device' || true)
# A few GPU tests check host-side promises and pass without a device (cuBLAS not loaded at start);
# every other one must skip, saying why.
n_pass=$(grep '"part":"tests"' "$summary" | grep -c '"result":"pass"' || true)
((n_tests >= 20)) || fails+=("only $n_tests GPU test results (each binary should list its tests)")
if ((n_skip + n_pass != n_tests)); then
  odd=$(grep '"part":"tests"' "$summary" | grep -v '"result":"pass"' | grep -vm1 '"result":"skip","detail":"no CUDA device' || true)
  fails+=("$((n_tests - n_skip - n_pass)) GPU tests neither passed nor reported the skip 'no CUDA device': $odd")
fi
for t in tiny-fp32 tiny-bf16 zaya1-tiny-fp32 zaya1-tiny-bf16; do
  grep -q "\"check\":\"cpu $t\",\"result\":\"pass\"" "$summary" || fails+=("the CPU twin $t did not train")
done
grep -q '"check":"launch 2 islands (cpu)","result":"pass"' "$summary" || fails+=("the two islands did not train (redis-server or launch)")
n_files=$(find "$root/out" -type f | wc -l)
((n_files <= 8)) || fails+=("$n_files files under \$OUT; at most 8 come back")
if ((${#fails[@]})); then
  printf 'check_gpu_kit: FAIL: %s\n' "${fails[@]}" >&2
  exit 1
fi
echo "check_gpu_kit: the kit runs in a minimal Debian root: $n_skip GPU tests skipped (no CUDA device), $n_pass passed without one, 4 CPU twins and 2 islands trained, $n_files files under \$OUT"
