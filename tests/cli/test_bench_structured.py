"""The `bench structured` topic: one quick run in this process (the tiny random model with the default model's
vocabulary), its figures real and consistent with each other, its table, and its words when xgrammar is missing.
No speed is asserted: the aim (a precomputed mask under 10% of a decode step) is only printed as met or not."""

from __future__ import annotations

import sys

import pytest
from bench_helpers import positive
from cli_helpers import run_cli

from llm_anatomy.cli.bench import structured
from llm_anatomy.constrained import DEAD, compile_pattern, schema_pattern


@pytest.fixture(scope="module")
def quick_json():
    return run_cli("bench", "structured", "--json", "--quick", "--model-size", "tiny", "--device", "cpu",
                   "--threads", "1").json()


def test_the_mask_figures_are_real_and_the_cache_is_what_makes_it_cheap(quick_json):
    r, m = quick_json, quick_json["mask_per_step"]
    assert (r["device"], r["model"], r["threads"], r["schema"]) == ("cpu", "tiny", 1, structured.SCHEMA)
    for key in ("naive_s", "cached_s", "trie_first_s", "decode_step_s"):
        assert positive(m[key]), key
    assert m["cached_s"] < m["naive_s"] and m["cached_s"] < m["trie_first_s"]  # a look-up beats any walk
    assert m["cached_over_decode"] == pytest.approx(m["cached_s"] / m["decode_step_s"])
    assert r["aim_met"] is (m["cached_over_decode"] < structured.AIM)  # printed from the figures, not asserted
    assert r["ours_compile"]["dfa_states"] == compile_pattern(schema_pattern(structured.SCHEMA)).num_states
    assert 0 < r["ours_compile"]["minimal_dfa_states"] <= r["ours_compile"]["dfa_states"]


def test_decoding_figures_count_the_tokens_each_run_made(quick_json):
    r, d = quick_json, quick_json["decode"]
    assert {"unconstrained", "constrained", "constrained_cold"} <= set(d)
    assert 0 < r["prompt_s"] < min(row["seconds"] for row in d.values())  # every run prefills the prompt first
    for name, row in d.items():
        assert 0 < row["tokens"] <= r["max_new_tokens"] and row["tokens_per_s"] == pytest.approx(
            row["tokens"] / (row["seconds"] - r["prompt_s"])), name
    assert d["constrained"]["tokens"] == d["constrained_cold"]["tokens"]  # greedy: the same answer, cached or not
    dfa = compile_pattern(schema_pattern(structured.SCHEMA))
    assert dfa.walk(dfa.start, r["answers"]["constrained"].encode()) != DEAD  # the schema's JSON, so far
    assert r["constrained_over_unconstrained"] == pytest.approx(
        d["constrained"]["tokens_per_s"] / d["unconstrained"]["tokens_per_s"])


def test_xgrammar_decodes_the_same_answer_under_its_own_mask(quick_json):
    pytest.importorskip("xgrammar")
    x = quick_json["xgrammar"]
    assert positive(x["mask_s"]) and positive(x["compile_s"]) and x["same_answer"] is True
    assert x["mask_over_decode"] == pytest.approx(x["mask_s"] / quick_json["mask_per_step"]["decode_step_s"])
    assert quick_json["decode"]["xgrammar"]["tokens"] == quick_json["decode"]["constrained"]["tokens"]


def test_the_table_says_whether_the_aim_is_met_and_how_to_get_xgrammar(quick_json, monkeypatch):
    table = structured.format_table(quick_json)
    assert ("aim: a precomputed mask under 10% of a decode step: " + ("met" if quick_json["aim_met"] else "NOT met")
            ) in table and "naive, every token walked" in table
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now fails, as where it is not installed
    assert structured._xgrammar() is None
    missing = {**quick_json, "xgrammar": None, "xgrammar_missing": "xgrammar is not installed: " + structured.INSTALL}
    missing["decode"] = {k: v for k, v in quick_json["decode"].items() if k != "xgrammar"}
    table = structured.format_table(missing)
    assert "pip install --no-deps -r requirements-nodeps.txt" in table and "xgrammar (fill" not in table


def test_a_device_other_than_the_cpu_is_refused_in_one_line_before_any_work():
    run = run_cli("bench", "structured", "--device", "meta", "--threads", "1")
    assert (run.code, run.out) == (1, "") and run.err.startswith("error: ") and run.err.count("\n") == 1
