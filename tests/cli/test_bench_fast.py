"""The `bench fast` topic: its JSON structure (one small subprocess run) and its table. No speed is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from llm_anatomy.cli.bench.fast import format_table


@pytest.fixture(scope="module")
def quick_json():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "llm_anatomy", "bench", "fast", "--json", "--quick", "--model-size",
                           "tiny", "--device", "cpu", "--threads", "1"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_json_has_every_figure(quick_json):
    r = quick_json
    assert r["device"] == "cpu" and r["model"] == "tiny" and r["threads"] == 1 and _positive(r["read_bandwidth_bytes_per_s"])
    d = r["decode"]
    assert set(d["tokens_per_s"]) == {"transformers", "plain", "fused", "fused_in_out"}
    assert all(_positive(v) for v in d["tokens_per_s"].values()) and d["same_tokens"] is True
    assert d["fastest"] in ("plain", "fused", "fused_in_out") and _positive(d["fused_vs_transformers"])
    assert _positive(r["bandwidth"]["fraction_of_read_bandwidth"])
    s = r["speculative"]
    assert s["same_tokens"] is True and s["draft_length"] == 4 and _positive(s["speedup"])
    assert set(s["by_model"]) == {"fused", "fused_in_out"} and s["best"] in s["by_model"]
    for row in s["by_model"].values():
        assert row["same_tokens"] is True and 0 <= row["acceptance_rate"] <= 1 and _positive(row["speculative_tokens_per_s"])
    t = r["tiled_attention"]
    assert t["prompt_tokens"] == 512 and t["max_abs_difference"] < 1e-5
    assert t["tiled_peak_bytes"] < t["plain_peak_bytes"] and 0 < t["ratio"] < 1
    k = r["int8_kernel"]
    assert k["available"] is False or all(_positive(k[key]) for key in ("fp32_ms", "int8_bf16_activations_ms"))
    assert set(r["targets"]) == {"fused_vs_transformers", "decode_read_bandwidth_fraction", "prompt_lookup_speedup",
                                 "tiled_peak_memory_ratio_4096"}
    assert "static_step" not in r  # no --compile, no GPU


def test_the_table_names_each_figure(quick_json):
    text = format_table(quick_json)
    for words in ("transformers generate", "fused projections", "read bandwidth", "prompt lookup", "tiled", "targets:"):
        assert words in text


def test_the_default_bench_keeps_its_topics():
    from llm_anatomy.cli.main import BENCHES

    assert "fast" in BENCHES and "decode" in BENCHES
