"""The decode benchmark: its JSON structure (one small run, in this process) and its table."""

from __future__ import annotations


import pytest
from bench_helpers import positive, quick_bench_json
import torch

from llm_anatomy.cli.bench.decode import format_table


@pytest.fixture(scope="module")
def quick_json():
    return quick_bench_json("decode")



def test_json_has_every_figure(quick_json):
    r = quick_json
    assert r["device"] == "cpu" and r["model"] == "tiny" and r["quick"] is True and r["threads"] == 1
    assert positive(r["peaks"]["matmul_flops_per_s"]) and positive(r["peaks"]["bandwidth_bytes_per_s"])
    g = r["generate"]
    for key in ("scratch_tokens_per_s", "transformers_tokens_per_s", "ratio"):
        assert positive(g[key]), key
    assert g["same_tokens"] is True  # fp32 on the CPU: the same greedy tokens as transformers
    assert g["spread"] == {"scratch": None, "transformers": None}  # --quick times once: no spread to tell (null)
    kv = r["kv_cache"]
    for key in ("with_cache_tokens_per_s", "without_cache_tokens_per_s", "speedup"):
        assert positive(kv[key]), key
    assert kv["same_tokens"] is True and kv["first_divergence"] is None
    assert [row["prompt_tokens"] for row in r["prefill"]] == [16, 64]
    assert [row["batch"] for row in r["decode_batch"]] == [1, 4]
    for row in r["prefill"]:  # both attention paths, each on its own count of the work
        assert row["naive_flops_per_s"] == row["flops_per_s"]
        assert all(positive(row[k]) for k in ("sdpa_seconds", "sdpa_tokens_per_s", "sdpa_flops_per_s", "sdpa_intensity"))
        assert row["sdpa_intensity"] > row["intensity"]  # no score matrix in memory: fewer bytes for its FLOPs
    for row in r["prefill"] + r["decode_batch"]:
        assert all(positive(row[k]) for k in ("tokens_per_s", "flops_per_s", "intensity"))
    assert positive(r["bandwidth_use"]["bytes_per_token"]) and positive(r["bandwidth_use"]["fraction"])
    assert set(r["targets"]) == {"scratch_vs_transformers", "kv_cache_speedup", "decode_bandwidth_fraction"}
    assert "cuda_graph" not in r  # CPU: no graph


def test_the_table_names_each_figure(quick_json):
    text = format_table(quick_json)
    for words in ("transformers generate", "with the cache", "speedup", "prefill:", "decode:", "of the measured bandwidth"):
        assert words in text


def test_the_first_divergence_of_two_greedy_runs():
    from llm_anatomy.cli.bench.decode import _first_divergence

    assert _first_divergence(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 5, 4]])) == 2
    assert _first_divergence(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 9]])) == 1  # any row
    assert _first_divergence(torch.tensor([[7, 8]]), torch.tensor([[7, 8]])) is None
