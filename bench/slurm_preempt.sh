#!/usr/bin/env bash
# The sbatch script of docs/cluster.md under a real Slurm, preempted again and again (issue 38;
# the long form of slurm_slurm_test's requeue case): a one-host cluster
# (tests/slurm/one_host_slurm.sh), the script taken from the page, 2 islands x 2 workers. Each
# try submits it, sends SIGTERM to its tasks (`scancel --signal=TERM`) at a random step, and
# waits for the script to requeue the job and for it to resume and finish. Per try it checks the
# job COMPLETED after one restart with the theta hash of the same run uninterrupted (`atoll
# launch`), and measures
#   stop:    from the SIGTERM to the `preempted` event (the agreed step's checkpoint written)
#   restart: from the `preempted` event to the `resume` event (Slurm's requeue wait included:
#            the credential lifetime + 1 s, 11 s in this cluster, 121 s by default)
# and prints the medians. Needs root (network namespaces) and slurm-wlm, munge, redis-server.
#
#   bench/slurm_preempt.sh [TRIES] [CONFIG]     (default: 3 configs/tiny.toml)
#
# Settings: STEPS (200), H (5: diloco.inner_steps, unless CONFIG has a [diloco] section), ATOLL
# (build/atoll), ATOLL_BENCH_OUT (/tmp/atoll-slurm-preempt). The machine's load goes into the
# timings: say what else ran.
set -euo pipefail
cd "$(dirname "$0")/.."
tries=${1:-3}
config=$(realpath "${2:-configs/tiny.toml}")
ATOLL=$(realpath "${ATOLL:-build/atoll}")
OUT=${ATOLL_BENCH_OUT:-/tmp/atoll-slurm-preempt}
STEPS=${STEPS:-200} H=${H:-5}
slurm=$PWD/tests/slurm/one_host_slurm.sh
[ "$(id -u)" = 0 ] || { echo "slurm_preempt.sh: needs root (ip netns)" >&2; exit 2; }
[ -x "$ATOLL" ] || { echo "slurm_preempt.sh: no atoll at $ATOLL (build it, or set ATOLL)" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT"
trap '$slurm down "$OUT/cluster"' EXIT
$slurm up "$OUT/cluster"
# The page's script: its bash block that starts with #!/bin/bash and #SBATCH lines.
python3 - docs/cluster.md >"$OUT/atoll.sbatch" <<'PY'
import sys
page = open(sys.argv[1]).read()
at = page.find("```bash\n#!/bin/bash\n#SBATCH")
if at < 0: sys.exit("slurm_preempt.sh: no sbatch script in docs/cluster.md")
start = page.index("\n", at) + 1
print(page[start:page.index("\n```", start)])
PY
# The script passes no --set but train.threads: the steps go into the config it reads.
export ATOLL_CONFIG=$OUT/run.toml PATH=$(dirname "$ATOLL"):$PATH
sed -E "0,/^steps *=.*/s//steps = $STEPS/" "$config" >"$ATOLL_CONFIG"
grep -q "^steps = $STEPS\$" "$ATOLL_CONFIG" || { echo "slurm_preempt.sh: no [train] steps line in $config" >&2; exit 2; }
# Outer steps every H steps (a stop lands at most an outer round ahead, so H must be well below
# STEPS), unless the config sets its own [diloco].
grep -q '^\[diloco\]' "$ATOLL_CONFIG" || printf '\n[diloco]\ninner_steps = %s\n' "$H" >>"$ATOLL_CONFIG"
"$ATOLL" launch --islands 2 --workers-per-island 2 --config "$ATOLL_CONFIG" --set train.threads=1 --run-dir "$OUT/uninterrupted" \
  >"$OUT/uninterrupted.log" 2>&1
last_theta() {  # the theta hashes of a run's last outer step, one line
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"theta_hash"' in l]
last = max(r["step"] for r in rows)
print(" ".join(sorted({r["theta_hash"] for r in rows if r["step"] == last})))
PY
}
reference=$(last_theta "$OUT/uninterrupted")
in_slurm() { (cd "$OUT" && $slurm run "$OUT/cluster" "$@"); }
now() { date +%s.%N; }

for t in $(seq 1 "$tries"); do
  id=$(in_slurm sbatch --parsable --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --open-mode=append \
    --output="$OUT/job$t.out" atoll.sbatch)
  id=${id%%;*}
  run=$OUT/runs/atoll-$id
  at=$((STEPS / 5 + RANDOM % (2 * STEPS / 5)))  # somewhere in the run's second and third fifths
  for _ in $(seq 1200); do
    n=$(tail -n 1 "$run/metrics.jsonl" 2>/dev/null | grep -o '"step":[0-9]*' | cut -d: -f2 || true)
    [ "${n:-0}" -ge "$at" ] && break
    sleep 0.1
  done
  in_slurm scancel --signal=TERM "$id"; term=$(now)
  for _ in $(seq 1800); do [ -z "$(in_slurm squeue -h -j "$id" -o %T)" ] && break; sleep 0.2; done
  job=$(in_slurm scontrol show job "$id")
  python3 - "$run" "$term" "$t" "$reference" "$(last_theta "$run")" "$job" >>"$OUT/results.txt" <<'PY'
import json, sys
run, term, t, ref, got, job = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
ev = {}
for l in open(run + "/events.jsonl"):
    r = json.loads(l)
    ev.setdefault(r["event"], r)
ok = "JobState=COMPLETED" in job and "Restarts=1 " in job and got == ref and "preempted" in ev and "resume" in ev
stop = ev["preempted"]["time"] - term if "preempted" in ev else float("nan")
restart = ev["resume"]["time"] - ev["preempted"]["time"] if "resume" in ev and "preempted" in ev else float("nan")
print(json.dumps({"try": int(t), "ok": ok, "stopped_at": ev.get("preempted", {}).get("step"), "stop_s": stop,
                  "restart_s": restart, "theta_equal": got == ref}))
PY
  tail -1 "$OUT/results.txt"
done
python3 - "$OUT/results.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda k: statistics.median(r[k] for r in rows)
bad = [r["try"] for r in rows if not r["ok"]]
print(f"{len(rows)} tries: stop {med('stop_s'):.2f} s, restart {med('restart_s'):.2f} s (medians); "
      + ("all completed after one requeue with the uninterrupted theta" if not bad else f"FAILED tries {bad}"))
sys.exit(1 if bad else 0)
PY
