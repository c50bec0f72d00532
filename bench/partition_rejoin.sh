#!/usr/bin/env bash
# A real partition, timed (issue 38): three emulated hosts (tests/net/emulated_hosts.sh), the
# store on host 0, one island per host started by hand (`atoll worker`, no launcher). Host 2's
# link is cut (down at the router) for CUT_S seconds, then restored; host 2 rejoins by itself
# (fault.rejoin_timeout_s). Per try it measures
#   cut -> next commit:  from the cut to the first outer step islands 0 and 1 commit without it
#   restore -> rejoin:   from the restored link to host 2's `rejoined` event
# and prints the medians over the tries. Needs root (network namespaces).
#
#   bench/partition_rejoin.sh [TRIES] [CONFIG]     (default: 5 configs/tiny.toml)
#
# Settings: CUT_S (5), STEPS (150), H (5), BATCH (2), TTL (1), TIMEOUT (3), ATOLL (build/atoll),
# ATOLL_BENCH_OUT (/tmp/atoll-partition-rejoin). The machine's load goes into the timings: say
# what else ran.
set -euo pipefail
cd "$(dirname "$0")/.."
tries=${1:-5}
config=${2:-configs/tiny.toml}
ATOLL=${ATOLL:-build/atoll}
OUT=${ATOLL_BENCH_OUT:-/tmp/atoll-partition-rejoin}
CUT_S=${CUT_S:-5} STEPS=${STEPS:-150} H=${H:-5} BATCH=${BATCH:-2} TTL=${TTL:-1} TIMEOUT=${TIMEOUT:-3}
name=atlpbench
hosts=tests/net/emulated_hosts.sh
[ "$(id -u)" = 0 ] || { echo "partition_rejoin.sh: needs root (ip netns)" >&2; exit 2; }
[ -x "$ATOLL" ] || { echo "partition_rejoin.sh: no atoll at $ATOLL (build it, or set ATOLL)" >&2; exit 2; }
trap '$hosts down $name' EXIT
rm -rf "$OUT"; mkdir -p "$OUT"

now() { date +%s.%N; }
# Outer steps islands of RUN_DIR logged (theta_hash rows).
outer_rows() { local n; n=$(grep -c '"theta_hash"' "$1/metrics.jsonl" 2>/dev/null) || true; echo "${n:-0}"; }

for t in $(seq 1 "$tries"); do
  d=$OUT/try$t; mkdir -p "$d"
  $hosts up $name 3 >"$d/hosts.log"
  ip netns exec $name-h0 redis-server --bind 10.79.0.2 --port 6390 --protected-mode no --save '' --appendonly no \
    >"$d/redis.log" 2>&1 &
  for _ in $(seq 100); do grep -q "Ready to accept" "$d/redis.log" && break; sleep 0.1; done
  pids=()
  for i in 0 1 2; do
    ip netns exec $name-h$i "$ATOLL" worker --store redis://10.79.0.2:6390 --island $i --rank 0 --islands 3 \
      --run-id bench$t --config "$config" --run-dir "$d/run$i" --set train.steps="$STEPS" --set diloco.inner_steps="$H" \
      --set train.batch_size="$BATCH" --set train.eval_every=0 --set checkpoint.every=0 --set train.threads=1 \
      --set fault.heartbeat_s=0.2 --set fault.heartbeat_ttl_s="$TTL" --set fault.timeout_s="$TIMEOUT" \
      --set fault.rejoin_timeout_s=120 >"$d/worker$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1200); do [ "$(outer_rows "$d/run2")" -ge 3 ] && break; sleep 0.1; done
  before=$(outer_rows "$d/run0")
  $hosts cut $name 2; cut=$(now)
  seen=$before
  : >"$d/run0_times.txt"  # "OUTER_STEP UNIX_TIME": when island 0 logged each outer step
  while :; do
    n=$(outer_rows "$d/run0")
    [ "$n" -gt "$seen" ] && { echo "$n $(now)" >>"$d/run0_times.txt"; seen=$n; }
    [ "$(echo "$(now) - $cut >= $CUT_S" | bc)" = 1 ] && break
    sleep 0.02
  done
  $hosts restore $name 2; restored=$(now)
  rcs=()
  for p in "${pids[@]}"; do
    for _ in $(seq 3000); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p"; rcs+=(hang); else wait "$p" && rcs+=(0) || rcs+=($?); fi
  done
  python3 - "$d" "$cut" "$restored" "${rcs[*]}" <<'PY'
import json, sys
d, cut, restored, rcs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
# The next commit: the first outer step island 0 logged after the cut that host 2 never logged
# (one decided before the cut and logged after it does not count).
host2 = {json.loads(l)["outer_step"] for l in open(f"{d}/run2/metrics.jsonl") if '"theta_hash"' in l}
times = [tuple(map(float, l.split())) for l in open(f"{d}/run0_times.txt")]
nxt = next((t for s, t in times if int(s) not in host2), float("nan"))
rejoined = [json.loads(l) for l in open(f"{d}/run2/events.jsonl") if '"rejoined"' in l]
back = rejoined[0]["time"] - restored if rejoined else float("nan")
json.dump({"cut_to_commit_s": nxt - cut, "restore_to_rejoin_s": back, "exit_codes": rcs}, open(f"{d}/result.json", "w"))
print(f"try {d[-1]}: cut -> next commit {nxt - cut:.2f} s, restore -> rejoin {back:.2f} s, exit codes {rcs}")
PY
  $hosts down $name
done
python3 - "$OUT" "$tries" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{out}/try{t}/result.json")) for t in range(1, n + 1)]
for k in ("cut_to_commit_s", "restore_to_rejoin_s"):
    v = sorted(r[k] for r in rs)
    print(f"{k}: median {statistics.median(v):.2f} s (min {v[0]:.2f}, max {v[-1]:.2f}) over {n} tries")
print("exit codes:", [r["exit_codes"] for r in rs])
PY
