#!/usr/bin/env bash
# End-to-end Mixtral-semantics check: export a checkpoint, evaluate it with atoll and with an
# independent Hugging Face-layout forward in PyTorch on the same windows, compare the losses.
#   scripts/check_hf_export.sh RUN_OR_CHECKPOINT SHARD.bin [WINDOWS]
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=$1 shard=$2 windows=${3:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
build/atoll export --checkpoint "$ckpt" --format hf --out "$out/hf" >/dev/null
T=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_position_embeddings"])' "$out/hf/config.json")
ours=$(build/atoll eval --checkpoint "$ckpt" --data "$shard" --tokens $((T * windows)) | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
theirs=$(/usr/bin/python3 scripts/check_hf_export.py "$out/hf" "$shard" "$T" "$windows")
python3 - "$ours" "$theirs" <<'PY'
import sys
a, b = map(float, sys.argv[1:])
rel = abs(a - b) / abs(b)
print(f"atoll eval {a:.7f}, Mixtral reference {b:.7f}, relative difference {rel:.1e}")
sys.exit(0 if rel < 1e-5 else 1)  # fp32 engine against an fp64 reference
PY
