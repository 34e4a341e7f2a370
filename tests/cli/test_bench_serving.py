"""The serving benchmark: its JSON structure (one small run on a tiny random model, in this process) and its table."""

from __future__ import annotations


import pytest
from bench_helpers import positive, quick_bench_json

from llm_anatomy.cli.bench.serving import format_table


@pytest.fixture(scope="module")
def quick_json():
    return quick_bench_json("serving")



def test_json_has_every_figure(quick_json):
    r = quick_json
    assert r["device"] == "cpu" and r["model"] == "tiny" and r["quick"] is True and r["threads"] == 1
    assert r["trace"]["same_tokens"] is True  # static and continuous batching: the same greedy tokens
    for name in ("static", "continuous"):
        m = r[name]
        assert m["requests"] == r["trace"]["requests"] == 8
        for key in ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "request_goodput_req_s"):
            assert positive(m[key]) or (key == "request_goodput_req_s" and m[key] == 0), (name, key)
        assert m["ttft_p50_s"] <= m["ttft_p99_s"] and m["tpot_p50_s"] <= m["tpot_p99_s"]
        assert m["itl_p50_s"] <= m["itl_p99_s"] and m["ttft_p50_s"] <= m["e2e_p50_s"] <= m["e2e_p99_s"]
    assert r["static"]["output_tokens"] == r["continuous"]["output_tokens"]
    cap = r["capacity_req_s"]  # measured first; the trace's rate is a stated fraction of it
    assert positive(cap["static"]) and positive(cap["continuous"])
    assert r["trace"]["rate_per_s"] == pytest.approx(r["trace"]["load"] * cap["continuous"])
    sweep = r["load_sweep"]
    assert [(row["fraction"], row["server"]) for row in sweep] == [(f, s) for f in (0.3, 0.7, 1.2)
                                                                  for s in ("static", "continuous")]
    assert all(row["ttft_p50_s"] <= row["ttft_p99_s"] and 0 <= row["attainment"] <= 1 for row in sweep)
    assert all(row["rate_req_s"] == pytest.approx(row["fraction"] * cap["continuous"]) for row in sweep)
    assert set(r["goodput_distserve_req_s"]) == {"static", "continuous"}
    assert positive(r["continuous_over_static_throughput"])
    kv = r["kv_utilisation"]  # simulated, seeded: the same figures on every machine
    assert kv["paged_utilisation"] >= 0.9 and kv["reserve_max_utilisation"] <= 0.38
    p = r["prefix_cache"]
    assert p["system_tokens"] == 64 and all(positive(p[k]) for k in ("ttft_miss_s", "ttft_hit_s", "speedup"))
    g = r["vs_generate_batch"]
    assert g["same_tokens"] is True  # our scheduler and transformers' generate_batch agree
    assert all(positive(g[k]) for k in ("ours_tokens_per_s", "flattened_tokens_per_s", "theirs_tokens_per_s", "ratio",
                                        "flattened_ratio"))
    assert g["flattened_ratio"] == pytest.approx(g["flattened_tokens_per_s"] / g["theirs_tokens_per_s"])
    f = r["flattened"]  # one flattened call per iteration against the padded calls, the same requests
    assert f["same_tokens"] is True and f["requests"] == 8 and f["output_tokens"] == r["static"]["output_tokens"]
    assert all(positive(f[k]) for k in ("padded_tokens_per_s", "flattened_tokens_per_s", "ratio"))
    assert f["ratio"] == pytest.approx(f["flattened_tokens_per_s"] / f["padded_tokens_per_s"])
    assert set(r["aims"]) == {"continuous_over_static_throughput", "paged_utilisation", "prefix_hit_ttft_speedup",
                              "ours_over_generate_batch", "flattened_over_generate_batch"}


def test_the_table_names_each_figure(quick_json):
    text = format_table(quick_json)
    for words in ("static", "continuous", "TTFT p99", "KV utilisation", "prefix cache", "generate_batch", "aim",
                  "capacity", "DistServe", "ITL p99", "flattened"):
        assert words in text, words
