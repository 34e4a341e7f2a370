#!/usr/bin/env bash
# GPU check for notebooks 06-07 and the decode benchmark. Run from the repository root on a CUDA machine
# whose venv has a CUDA build of torch and the default model in its cache (`make model` while online).
#
#     bash tools/gpu_check.sh            # about 5-8 minutes on a recent GPU
#
# Writes the figures to $OUT (default: gpu_check_out/) and prints a short summary.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
$PY - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to torch: this check needs one")
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PYEOF
echo "== bench, default model (SmolLM2-135M, bf16)"
timeout 240 $PY -m llm_anatomy bench --json > "$OUT/bench_default.json"
echo "== bench, 1B-shaped random-weight Llama (bf16)"
timeout 240 $PY -m llm_anatomy bench --json --model-size 1b > "$OUT/bench_1b.json"
$PY - "$OUT" <<'PYEOF'
import json, sys
from llm_anatomy.cli.bench.decode import format_table
for name in ("bench_default", "bench_1b"):
    with open(f"{sys.argv[1]}/{name}.json") as f:
        r = json.load(f)
    print(f"\n---- {name}\n" + format_table(r))
PYEOF
echo "== notebook 07 under nbval"
timeout 300 $PY -m pytest notebooks/07_prefill_and_decode.ipynb --nbval-lax --nbval-current-env \
    --nbval-cell-timeout=280 -p no:cacheprovider -q 2>&1 | tail -5 | tee "$OUT/nbval_07.txt"
