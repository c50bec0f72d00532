# Sourced by the benchmarks that measure workers' memory (bench/ckpt_rss.sh,
# bench/context_parallel.sh). worker_hwm LAUNCHER_PID: waits for the launcher, sampling every
# 50 ms the VmHWM of each worker process it started (its children named " worker ", not the
# store); VmHWM only grows, so the last sample is at most 50 ms before a worker exits. Leaves
# one line per worker in the array HWM_KB (kB), the workers' CPU seconds (user + system, all
# threads, at the last sample) summed in CPU_S, and the launcher's exit status in $?.
worker_hwm() {
  local launcher=$1 pid kb ticks
  declare -A seen=() cpu=()
  while kill -0 "$launcher" 2>/dev/null; do
    for pid in $(pgrep -P "$launcher" -f " worker " || true); do
      kb=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [ -n "$kb" ] && seen[$pid]=$kb
      # utime and stime: fields 14 and 15 of /proc/PID/stat (the name, field 2, has no spaces here)
      ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || true)
      [ -n "$ticks" ] && cpu[$pid]=$ticks
    done
    sleep 0.05
  done
  HWM_KB=("${seen[@]}")
  CPU_S=$(printf '%s\n' "${cpu[@]}" 0 | awk -v hz="$(getconf CLK_TCK)" '{s += $1} END {printf "%.1f", s / hz}')
  wait "$launcher"
}
