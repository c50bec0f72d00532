#!/usr/bin/env bash
# The share of ring attention's communication hidden behind compute, zigzag layout against the
# plain split (docs/long_context.md): bench/context_parallel.sh at one length for P = 2 and 4,
# with the ring's transfers overlapped (as training runs) and with ATOLL_RING_OVERLAP=0 (each
# transfer waited for before computing: its whole time shows as wait), for ATOLL_CP_LAYOUT =
# zigzag and plain.
#   bench/ring_overlap.sh [STEPS] [T]     # defaults 2 steps, T = 8192
#   PS=2 bench/ring_overlap.sh ...          # only these P (default "2 4"; P = 4 wants 4 cores)
#   ATOLL_RING_SYNC=1 bench/ring_overlap.sh ...   # the neighbours meet before each transfer
# Under ATOLL_RING_SYNC=1 a slower peer's lateness is counted apart (sync_ov_s, sync_ser_s), so the
# waits, and the hidden share, are the transfers' own.
# hidden = 1 - wait(overlapped) / wait(not overlapped), per layout and P; wait is per rank,
# the mean over ranks, and counts both the transfer and waiting for a slower peer (the plain
# split's last rank does P times the first's attention work, so the others wait for it).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2} T=${2:-8192} ps=${PS:-2 4} out=/tmp/atoll-ring-overlap
mkdir -p "$out"
for layout in zigzag plain; do
  for overlap in 1 0; do
    echo "== ATOLL_CP_LAYOUT=$layout ATOLL_RING_OVERLAP=$overlap"
    ATOLL_CP_LAYOUT=$layout ATOLL_RING_OVERLAP=$overlap PS="$ps" bench/context_parallel.sh "$steps" "$T" |
      tee "$out/$layout-$overlap.txt"
  done
done
echo "== hidden share of ring communication (T = $T)"
printf '%-7s %-2s %12s %10s %10s %8s %10s %10s\n' layout P tokens_per_s wait_ov_s wait_ser_s hidden sync_ov_s sync_ser_s
for layout in zigzag plain; do
  for P in $ps; do
    read -r tps wov sov < <(awk -v P="$P" '$2 == P && $1 ~ /^[0-9]+$/ {print $4, $8, $10}' "$out/$layout-1.txt")
    read -r _ wser sser < <(awk -v P="$P" '$2 == P && $1 ~ /^[0-9]+$/ {print $4, $8, $10}' "$out/$layout-0.txt")
    printf '%-7s %-2s %12s %10s %10s %8s %10s %10s\n' "$layout" "$P" "$tps" "$wov" "$wser" \
      "$(python3 -c "import sys; o,s=map(float,sys.argv[1:]); print('%.2f' % (1 - o / s) if s > 0 else '-')" "$wov" "$wser")" \
      "$sov" "$sser"
  done
done
