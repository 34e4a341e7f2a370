"""The `bench fast` topic: its JSON structure (one small run, in this process) and its table. No speed is asserted."""

from __future__ import annotations


import os

import pytest
import torch
from bench_helpers import positive, quick_bench_json

from llm_anatomy.cli.bench.fast import format_table
from llm_anatomy.fast.compiled import compiler_status


@pytest.fixture(scope="module")
def quick_json():
    return quick_bench_json("fast")



def test_json_has_every_figure(quick_json):
    r = quick_json
    assert r["device"] == "cpu" and r["model"] == "tiny" and r["threads"] == 1 and positive(r["read_bandwidth_bytes_per_s"])
    d = r["decode"]
    packed = r["packed"]
    assert set(packed) == {"int8", "int4"}
    ran = {fmt for fmt, row in packed.items() if "equal_prefix" in row}
    assert "int8" in ran  # the tiny model's rows fit int8; int4 may be refused (group size) with a reason
    assert set(d["tokens_per_s"]) == {"transformers", "plain", "fused", "fused_in_out"} | ran
    for fmt, row in packed.items():
        assert (fmt in ran) == bool(row["kernel"]) and (row["kernel"] or row["why_not"])
        if fmt in ran:
            assert row["tokens_compared"] == 16 and 0 <= row["equal_prefix"] <= 16
            # every token of the equal prefix agrees, and agreement counts whole tokens of 16
            assert row["agreement"] >= row["equal_prefix"] / 16 and (row["agreement"] * 16) % 1 == 0
            assert (row["agreement"] == 1) == (row["equal_prefix"] == 16)
            assert row["first_32_equal"] is (row["equal_prefix"] == 16)  # 16 < 32 tokens compared: all of them
    assert d["fastest_of_all"] in d["tokens_per_s"] and positive(d["fastest_vs_fused_fp32"])
    # the decode steps alone (llama.cpp's eval rate), for our decoders (generate's steps are not timed one by one)
    assert set(d["step_tokens_per_s"]) == set(d["tokens_per_s"]) - {"transformers"}
    assert all(positive(v) for v in d["step_tokens_per_s"].values())
    assert d["fastest_step_tokens_per_s"] == max(d["step_tokens_per_s"].values())
    assert r["targets"]["fastest_decode_tokens_per_s"]["value"] == d["fastest_step_tokens_per_s"]
    assert all(positive(v) for v in d["tokens_per_s"].values()) and d["same_tokens"] is True
    assert set(r["bandwidth"]["by_variant"]) == set(d["tokens_per_s"]) - {"transformers"}
    if "int8" in ran:
        by = r["bandwidth"]["by_variant"]
        assert by["int8"]["bytes_per_token"] < 0.5 * by["fused"]["bytes_per_token"]  # a byte a weight, not four
    assert d["spread"] == dict.fromkeys(d["tokens_per_s"])  # one timed run each (--quick): no spread to tell (null)
    assert d["fastest"] in ("plain", "fused", "fused_in_out") and positive(d["fused_vs_transformers"])
    assert positive(r["bandwidth"]["fraction_of_read_bandwidth"])
    s = r["speculative"]
    assert s["same_tokens"] is True and s["draft_length"] == 4 and positive(s["speedup"])
    assert set(s["by_model"]) == {"fused", "fused_in_out"} and s["best"] in s["by_model"]
    for row in s["by_model"].values():
        assert row["same_tokens"] is True and 0 <= row["acceptance_rate"] <= 1 and positive(row["speculative_tokens_per_s"])
    t = r["tiled_attention"]
    assert t["prompt_tokens"] == 512 and t["max_abs_difference"] < 1e-5
    assert t["tiled_peak_bytes"] < t["plain_peak_bytes"] and 0 < t["ratio"] < 1
    assert set(r["targets"]) == {"fused_vs_transformers", "decode_read_bandwidth_fraction", "prompt_lookup_speedup",
                                 "tiled_peak_memory_ratio_4096", "fastest_decode_tokens_per_s", "fastest_vs_fused_fp32",
                                 "int8_first_32_tokens_equal"}
    assert "static_step" not in r  # no --compile, no GPU
    sp = r["step_split"]  # the packed step's time by kind of op (issue 51)
    assert sp["model"] == ("int4" if "int4" in ran else d["fastest_of_all"]) and sp["steps"] == 3
    assert isinstance(sp["ops"], int) and sp["ops"] > 0 and all(positive(sp[k]) for k in ("matmuls", "rest", "step_s"))
    c = r["compiled"]  # the packed int4 step compiled (issue 51): each wrapper's compile, cold and warm, and speed
    if "int4" in ran and compiler_status()[0]:
        assert c["new_tokens"] == 16 and set(c["by_wrapper"]) == {"cpp", "python"}
        for wrapper, row in c["by_wrapper"].items():
            assert row["same_tokens"] is True, wrapper
            assert all(positive(row[k]) for k in ("cold_s", "warm_s", "step_tokens_per_s", "eager_step_tokens_per_s"))
            assert row["speedup"] == pytest.approx(row["step_tokens_per_s"] / row["eager_step_tokens_per_s"])
            assert [len(v) for v in row["per_turn_tokens_per_s"].values()] == [1, 1]  # --quick: one turn
        assert c["by_wrapper"]["cpp"]["cold_after"] == [] and c["by_wrapper"]["python"]["cold_after"] == ["cpp"]
    elif "int4" in ran:
        assert "no C++ compiler" in c["error"]
    ll = r["llama_cpp"]  # no llama-bench named in the tests: no figure, and the way to get one
    if not os.environ.get("LLAMA_BENCH"):
        assert ll["tokens_per_s"] is None and "tools/build_llama_bench.sh" in ll["note"]


def test_the_table_names_each_figure(quick_json):
    text = format_table(quick_json)
    for words in ("transformers generate", "fused projections", "packed int8", "read bandwidth", "prompt lookup", "tiled",
                  "targets:", "aten ops", "llama.cpp", "compiled packed int4 step"):
        assert words in text


def test_the_default_bench_keeps_its_topics():
    from llm_anatomy.cli.main import BENCHES

    assert "fast" in BENCHES and "decode" in BENCHES


def test_the_compiled_static_step_has_room_for_its_tracing_calls(tiny_model, monkeypatch):
    # --compile on a real compiler takes minutes; the eager backend only traces, through the same calls of the step
    from llm_anatomy.cli.bench import fast_compile
    from llm_anatomy.model.scratch import ScratchLlama

    real_compile = fast_compile.compile_step
    monkeypatch.setattr(fast_compile, "compile_step",
                        lambda fn, dev, mode=None: real_compile(fn, dev, mode=mode, backend="eager"))
    prompt = torch.tensor([[5, 6, 7]])
    out = fast_compile.static_step(ScratchLlama.from_hf(tiny_model), prompt, 4, torch.device("cpu"), True, reps=1)
    assert positive(out["eager_tokens_per_s"]) and positive(out["compiled_tokens_per_s"]) and out["graph_breaks"] == 0


def test_where_the_packed_tokens_part_from_fp32s(tiny_model):
    # each re-rounding alone; fp32's margin read where a variant first differs, at the token fp32 chose there
    from llm_anatomy.fast.packed import difference_sources
    from llm_anatomy.generate.decode import generate_greedy
    from llm_anatomy.model.scratch import ScratchLlama

    plain = ScratchLlama.from_hf(tiny_model)
    prompt = torch.tensor([[5, 6, 7, 8]])
    reference = generate_greedy(plain, prompt, 12).tokens[0]
    rows = difference_sources(plain, prompt, reference)
    assert set(rows) == {"int8 body, fp32 head", "int4 g32 body, fp32 head", "fp32 body, int8 head"}
    for row in rows.values():
        assert row["tokens_compared"] == 12 and 0 <= row["equal_prefix"] <= 12
        assert ("fp32_margin_at_first_difference" in row) is (row["equal_prefix"] < 12)
        assert row.get("fp32_margin_at_first_difference", 0) >= 0
    # against a reference that is not fp32's own choice, the variants part at once, and the margin is still fp32's
    wrong = (reference + 1) % plain.cfg.vocab_size
    rows = difference_sources(plain, prompt, wrong)
    assert all(row["equal_prefix"] == 0 for row in rows.values())
    logits = plain.trace(prompt, keep_hidden=False, logits_to_keep=1).logits[0, -1].float().topk(2).values
    assert all(row["fp32_margin_at_first_difference"] == pytest.approx(float(logits[0] - logits[1]), abs=1e-5)
               for row in rows.values())
