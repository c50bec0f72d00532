# Sourced by the benchmarks that measure workers' memory (bench/ckpt_rss.sh,
# bench/context_parallel.sh). worker_hwm LAUNCHER_PID: waits for the launcher, sampling every
# 50 ms the VmHWM of each worker process it started (its children named " worker ", not the
# store); VmHWM only grows, so the last sample is at most 50 ms before a worker exits. Leaves
# one line per worker in the array HWM_KB (kB), and the launcher's exit status in $?.
worker_hwm() {
  local launcher=$1 pid kb
  declare -A seen=()
  while kill -0 "$launcher" 2>/dev/null; do
    for pid in $(pgrep -P "$launcher" -f " worker " || true); do
      kb=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [ -n "$kb" ] && seen[$pid]=$kb
    done
    sleep 0.05
  done
  HWM_KB=("${seen[@]}")
  wait "$launcher"
}
