#!/usr/bin/env bash
# Elastic recovery figures (issue 19; docs/benchmarks.md "Elastic islands: recovery, join, goodput"):
#   1. time from a fault on island 2 of a 3-island run to training again (the first outer step
#      committed after it), for kill -9, a hang (SIGSTOP, let go 5 s later) and a partition;
#      without iptables (not installed, needs root, and loopback rules would cut every other
#      run on a shared machine) a partition is simulated by SIGSTOP too: from the others' side a cut-off worker and a stopped one look the same (no
#      heartbeat, no ring traffic, TCP connections left open);
#   2. join time against state size: restart event -> join event, for configs/tiny.toml and
#      configs/small.toml, with the state bytes (θ + momentum + the island's Adam moments);
#   3. goodput under a kill -9 of a random island every N outer steps: compute in committed outer
#      steps over the compute available, against the analytic bound of docs/benchmarks.md.
#   bench/elastic_recovery.sh [REPEATS] [N] [CONFIG]   # default 3 repeats, N = 10, configs/tiny.toml
#   (GOODPUT_OUTER=outer steps of the goodput runs, default 40 x N; PARTS="1 2 3" the parts to run,
#   3 needs 1)
# Output in $ATOLL_RECOVERY_OUT (default /tmp/atoll-recovery).
set -euo pipefail
cd "$(dirname "$0")/.."
export ATOLL=${ATOLL:-$(pwd)/build/atoll}
export REPEATS=${1:-3} EVERY=${2:-10} CONFIG=${3:-configs/tiny.toml}
export OUT=${ATOLL_RECOVERY_OUT:-/tmp/atoll-recovery}
rm -rf "$OUT"; mkdir -p "$OUT"
echo "elastic recovery: $REPEATS repeats, a kill every $EVERY outer steps, $CONFIG; load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - <<'PY'
import json, os, random, signal, statistics, subprocess, time
ATOLL, OUT, CONFIG = os.environ["ATOLL"], os.environ["OUT"], os.environ["CONFIG"]
REPEATS, EVERY = int(os.environ["REPEATS"]), int(os.environ["EVERY"])
PARTS = os.environ.get("PARTS", "1 2 3").split()
H, TIMEOUT, TTL = 5, 4.0, 1.0
FAST = ["--set", "fault.heartbeat_s=0.2", "--set", f"fault.heartbeat_ttl_s={TTL}", "--set", f"fault.timeout_s={TIMEOUT}",
        "--set", "fault.restart_backoff_s=0.2", "--set", "fault.max_restarts=1000", "--set", "checkpoint.every=0",
        "--set", f"diloco.inner_steps={H}", "--stop-grace", "1"]

def launch(name, config, steps, islands=3):
    run = f"{OUT}/{name}"
    args = [ATOLL, "launch", "--islands", str(islands), "--config", config, "--run-dir", run,
            "--set", f"train.steps={steps}", "--set", f"train.eval_every={steps}"] + FAST
    p = subprocess.Popen(args, stdout=open(run + ".log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return p, run

class Tail:  # the run's committed outer steps, as they arrive: outer step -> (arrival time, islands)
    def __init__(self, path): self.path, self.off, self.steps = path, 0, {}
    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.off)
                for line in f:
                    if not line.endswith("\n"): break
                    self.off += len(line)
                    r = json.loads(line)
                    if "theta_hash" in r:
                        t, isl = self.steps.get(r["outer_step"], (time.time(), set()))
                        isl.add(r["island"]); self.steps[r["outer_step"]] = (t, isl)
        except FileNotFoundError: pass
        return max(self.steps, default=0)

def worker(launcher, island):
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError: continue
        if ppid == launcher and " worker " in cmd and f"--island {island} " in cmd: return int(pid)
    return -1

def signal_worker(launcher, island, sig):
    # Never a pid <= 0: os.kill(-1, ...) signals every process this user may signal.
    pid = worker(launcher, island)
    if pid <= 0: raise SystemExit(f"no worker of island {island} under launcher {launcher} (did the run end early?)")
    os.kill(pid, sig)
    return pid

def events(run):
    return [json.loads(l) for l in open(run + "/events.jsonl") if l.strip()]

# 1. Detect, abort, re-form: fault -> next committed outer step.
recovery = {}
for kind in ("kill -9", "hang", "partition (SIGSTOP)") if "1" in PARTS else ():
    times, intervals = [], []  # fault -> next commit; the run's median commit interval before it
    for rep in range(REPEATS):
        p, run = launch(f"recover-{kind.split()[0]}-{rep}", CONFIG, 400)
        tail = Tail(run + "/metrics.jsonl")
        while tail.poll() < 3 and p.poll() is None: time.sleep(0.02)
        time.sleep(random.Random(rep).uniform(0, 1))  # a random point of the outer step
        before = tail.poll()
        arrivals = sorted(t for t, _ in tail.steps.values())
        interval = statistics.median(b - a for a, b in zip(arrivals, arrivals[1:])) if len(arrivals) > 2 else 0
        t0 = time.time()
        victim = signal_worker(p.pid, 2, signal.SIGKILL if kind == "kill -9" else signal.SIGSTOP)
        while tail.poll() <= before and p.poll() is None: time.sleep(0.01)
        times.append(tail.steps[tail.poll()][0] - t0)
        intervals.append(interval)
        if kind != "kill -9": os.kill(victim, signal.SIGCONT)
        p.terminate(); p.wait()  # measured: the rest of the run is not needed
    recovery[kind] = times
    print(f"{kind}: fault -> next committed outer step: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}; {REPEATS} runs); an outer step took "
          f"{statistics.median(intervals):.2f} s before the fault")

# 2. Join time against state size.
for config in ("configs/tiny.toml", "configs/small.toml") if "2" in PARTS else ():
    p, run = launch(f"join-{os.path.basename(config)}", config, 400 if "tiny" in config else 60)
    tail = Tail(run + "/metrics.jsonl")
    while tail.poll() < 2 and p.poll() is None: time.sleep(0.05)
    signal_worker(p.pid, 2, signal.SIGKILL)
    while p.poll() is None and not any(e["event"] == "join" for e in events(run)): time.sleep(0.1)
    p.terminate(); p.wait()
    ev = events(run)
    restart = next(e for e in ev if e["event"] == "restart")
    join = next((e for e in ev if e["event"] == "join"), None)
    params = next((e["params"] for e in ev if "params" in e), None)
    print(f"join {config}: restart -> join {join['time'] - restart['time']:.2f} s (restart backoff 0.2 s included; "
          f"waiting for the admitting commit {join.get('admission_wait_s', 0):.2f} s; state transfer "
          f"{join.get('transfer_bytes', 0) / 1e6:.1f} MB in {join.get('transfer_s', 0):.2f} s)"
          + (f"; {params} parameters" if params else "") if join else f"join {config}: no join event")

# 3. Goodput: a kill -9 of a random island every EVERY outer steps, against a fault-free run of
# GOODPUT_OUTER outer steps (default 40 x EVERY).
if "3" in PARTS:
    steps = int(os.environ.get("GOODPUT_OUTER", 40 * EVERY)) * H
    p, run = launch("goodput-clean", CONFIG, steps); p.wait()
    clean_s = max(e["time"] for e in events(run)) - min(e["time"] for e in events(run))
    p, run = launch("goodput-faults", CONFIG, steps)
    tail, rng, next_kill, kills = Tail(run + "/metrics.jsonl"), random.Random(7), EVERY, 0
    while p.poll() is None:
        if tail.poll() >= next_kill and tail.poll() < steps // H - EVERY:
            if worker(p.pid, island := rng.randrange(3)) > 0: signal_worker(p.pid, island, signal.SIGKILL); kills += 1
            next_kill += EVERY
        time.sleep(0.02)
    tail.poll()
    wall_s = max(e["time"] for e in events(run)) - min(e["time"] for e in events(run))
    contributed = sum(len(isl) for _, isl in tail.steps.values())
    # An island-step costs clean_s / steps of wall time on its core share; compute available: 3 islands x wall_s.
    goodput = contributed * H * (clean_s / steps) / (3 * wall_s)
    print(f"goodput: {kills} kills, one every {EVERY} outer steps (H = {H}): {contributed} island-outer-steps committed "
          f"of {3 * (steps // H)}; wall {wall_s:.1f} s against {clean_s:.1f} s fault-free; goodput {goodput:.3f}")
    # The analytic bound (docs/benchmarks.md): 1 - (T + R + (I-1) D + I X) / (I N T), from this run's own
    # figures: T the fault-free outer step, R restart -> join, D the kill's fault -> next commit less
    # the outer step's own rest (section 1), X the state transfer.
    ev = events(run)
    restarts = [e["time"] for e in ev if e["event"] == "restart"]
    joins = [e for e in ev if e["event"] == "join"]
    R = statistics.mean(j["time"] - max(t for t in restarts if t <= j["time"]) for j in joins) if joins else 0
    X = statistics.mean(j.get("transfer_s", 0) for j in joins) if joins else 0
    T = clean_s / (steps // H)
    D = max(0.0, statistics.median(recovery["kill -9"]) - T / 2)
    I = 3
    bound = 1 - (T + R + (I - 1) * D + I * X) / (I * EVERY * T)
    print(f"goodput bound: T {T:.2f} s, R {R:.2f} s, D {D:.2f} s, X {X:.3f} s over {len(joins)} joins: "
          f"{bound:.3f}; measured {goodput:.3f} ({goodput / bound:.1%} of the bound)")
    json.dump({"recovery_s": recovery, "goodput": goodput, "bound": bound, "kills": kills, "wall_s": wall_s,
               "clean_s": clean_s, "T": T, "R": R, "D": D, "X": X}, open(OUT + "/summary.json", "w"))
PY
