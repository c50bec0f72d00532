#!/usr/bin/env bash
# bench/islands_loss.sh over several seeds, then the paired comparison: for each seed, DiLoCo's
# final loss on the whole validation split against data parallel's of the same seed, and the
# mean and spread of those differences. One run per arm cannot resolve a few percent when the
# training itself is that noisy (docs/benchmarks.md, "Small config"); pairing by seed removes
# what the seed changes in both arms (initialisation, data order).
#   SEEDS="42 43 44" bench/islands_loss_seeds.sh CONFIG STEPS H [--set k=v ...]
#   SEEDS="42 43 44 45 46" bench/islands_loss_seeds.sh configs/tiny.toml 600 20 \
#       --set diloco.outer_lr=1.0 --set diloco.outer_momentum=0.0
# Results go to $ATOLL_BENCH_OUT/s<seed>/ (default /tmp/atoll-islands-loss-seeds); a seed
# whose two evaluations are already there is not run again (SKIP_DONE=0 reruns it), so an
# interrupted study resumes and `SEEDS=... ` with more seeds extends one.
# Settings: SEEDS (42 43 44), SKIP_DONE (1), and those of islands_loss.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1 steps=$2 h=$3
shift 3
seeds=${SEEDS:-42 43 44}
base=${ATOLL_BENCH_OUT:-/tmp/atoll-islands-loss-seeds}
name=$(basename "$config" .toml)
mkdir -p "$base"
for seed in $seeds; do
  out=$base/s$seed
  if [[ ${SKIP_DONE:-1} == 1 && -s $out/$name/ddp.eval.json && -s $out/$name/diloco.eval.json ]]; then
    echo "seed $seed: done before, kept" >&2
    continue
  fi
  ATOLL_BENCH_OUT=$out bench/islands_loss.sh "$config" "$steps" "$h" "$@" --set train.seed="$seed" >"$out.md"
  echo "seed $seed done" >&2
done
python3 - "$base" "$name" "$h" $seeds <<'PY'
import json, os, statistics, sys
base, name, h, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def loss(seed, arm):
    return json.load(open(os.path.join(base, "s" + seed, name, arm + ".eval.json")))["loss"]
rows = [(s, loss(s, "ddp"), loss(s, "diloco")) for s in seeds]
diff = [100 * (d / p - 1) for _, p, d in rows]
print(f"| seed | data parallel | DiLoCo H={h} | difference |")
print("|---:|---:|---:|---:|")
for (s, p, d), x in zip(rows, diff):
    print(f"| {s} | {p:.4f} | {d:.4f} | {x:+.1f}% |")
mp, md = statistics.mean(r[1] for r in rows), statistics.mean(r[2] for r in rows)
sd = statistics.stdev(diff) if len(diff) > 1 else float("nan")
print(f"| mean of {len(rows)} | {mp:.4f} | {md:.4f} | {100 * (md / mp - 1):+.1f}% "
      f"(paired: {statistics.mean(diff):+.1f}% ± {sd / len(diff) ** 0.5:.1f}% s.e., "
      f"range {min(diff):+.1f}% to {max(diff):+.1f}%) |")
if len(rows) > 1:
    print(f"\nSpread across seeds: data parallel ± {statistics.stdev(r[1] for r in rows):.4f}, "
          f"DiLoCo ± {statistics.stdev(r[2] for r in rows):.4f} (standard deviation)")
PY
