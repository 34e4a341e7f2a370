"""What the benchmark tests share: one quick run of a benchmark in a subprocess, and a check for a real figure."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys


def quick_bench_json(topic: str) -> dict:
    """`python -m llm_anatomy bench TOPIC --json --quick` on the tiny random model, on one CPU thread, offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "llm_anatomy", "bench", topic, "--json", "--quick", "--model-size",
                           "tiny", "--device", "cpu", "--threads", "1"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def positive(value) -> bool:
    """A real, finite, positive number (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
