#!/usr/bin/env bash
# Checks of notebook 07's measurement model (issue #11, B1-B5 and B8), on a GPU in a few minutes; on a CPU the
# GPU-only parts are skipped and say so. Run from the repository root:
#
#     bash tools/gpu_check.sh            # about 2-4 minutes on a recent GPU; under a minute on a CPU
#
# 1. tools/gpu_checks.py: random-weight models of the real shapes (SmolLM2-135M, a 1B-shaped Llama), so that no
#    download is needed: the prefill's logits and FLOP count (B1), the attention scores' bytes and where a long
#    prefill lands (B2), dtype-labelled peaks (B3), ops, kernel launches and a CUDA graph (B4), identical cached and
#    uncached tokens in fp32 (B5), a CPU mask beside GPU ids (B8).
# 2. the mask-device unit test, which runs its CUDA case on a GPU.
# 3. only when the default model is already in the cache: the decode benchmark, bench fast's compiled step with CUDA
#    graphs (issue 51), then every notebook 05-11 that exists under nbval; any raise, failed graph capture or token mismatch fails the check loudly ("!! ... FAILED").
#
# Writes $OUT (default: gpu_check_out/) and exits 1 when any check fails.
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
status=0

echo "== 1. measurement checks (random weights, real shapes on a GPU)"
timeout 420 "$PY" tools/gpu_checks.py --out "$OUT" 2>&1 | grep -v '^USDT' | tee "$OUT/gpu_checks.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== 2. an attention mask made on the CPU, ids on the device"
timeout 120 "$PY" -m pytest tests/generate/test_decode.py -k mask_made_on_the_cpu -q -p no:cacheprovider 2>&1 | tail -3 \
    | tee "$OUT/mask_device.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
CACHED=$("$PY" -c "from llm_anatomy.weights.cache import cache_problems, default_model_dir; \
print(int(not cache_problems(default_model_dir(), check_hashes=False)))" 2>/dev/null || echo 0)
if [ "$CUDA" = "1" ] && [ "$CACHED" = "1" ]; then
    echo "== 3. the default model: decode benchmark, then notebooks 05-11 (those that exist) under nbval"
    timeout 240 "$PY" -m llm_anatomy bench --json > "$OUT/bench_default.json" || { echo "bench FAILED"; status=1; }
    # issue 51 on a GPU: the fastest packed model's fixed-shape step compiled with mode="reduce-overhead" (inductor's
    # kernels replayed as CUDA graphs) and replayed from a hand-captured CUDA graph, against its eager step
    timeout 420 "$PY" -m llm_anatomy bench fast --compile --json > "$OUT/bench_fast_compiled.json" \
        || { echo "bench fast --compile FAILED"; status=1; }
    "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])).get('static_step', {}); print('   static step:', s); \
sys.exit(1 if 'error' in s or 'compiled_tokens_per_s' not in s else 0)" "$OUT/bench_fast_compiled.json" \
        || { echo "!! the compiled step with CUDA graphs FAILED: see $OUT/bench_fast_compiled.json"; status=1; }
    shopt -s nullglob
    notebooks=(notebooks/0[5-9]_*.ipynb notebooks/1[01]_*.ipynb)
    shopt -u nullglob
    [ "${#notebooks[@]}" -gt 0 ] || { echo "no notebook 05-11 found: run from the repository root"; status=1; }
    for nb in "${notebooks[@]}"; do
        name=$(basename "$nb" .ipynb)
        # --nbval-lax compares no outputs, but any cell that raises fails the notebook; graph capture failures and
        # token mismatches raise in the notebooks' claim cells, and a printed "FAILED" is caught below too
        timeout 400 "$PY" -m pytest "$nb" --nbval-lax --nbval-current-env --nbval-cell-timeout=280 \
            -p no:cacheprovider -q -p tools.site.capture --executed-to="$OUT/executed" > "$OUT/nbval_$name.txt" 2>&1
        rc=$?
        tail -3 "$OUT/nbval_$name.txt"
        if [ "$rc" -ne 0 ]; then
            echo "!! $name FAILED under nbval (exit $rc): see $OUT/nbval_$name.txt"; status=1
        elif grep -rqs "capture FAILED\|tokens differ\|MISMATCH" "$OUT/executed/$name.ipynb"; then
            echo "!! $name printed a failed graph capture or a token mismatch: see $OUT/executed/$name.ipynb"; status=1
        else
            echo "   $name passed"
        fi
    done
else
    echo "== 3. skipped: needs a CUDA GPU ($CUDA) and the default model in the cache ($CACHED); 'make model' fetches it"
fi

[ "$status" -eq 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED (see above and $OUT/)"
exit "$status"
