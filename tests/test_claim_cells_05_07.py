"""The C8 claim cells of notebooks 05 and 06, run as the notebooks hold them: each holds, and each fails
(ClaimFailed) in a counterfactual world (tests/test_claim_cells.py does the same for 02-04; the checks they call are
tested on a tiny model in tests/generate/test_claim_checks_05_06.py)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from llm_anatomy import load_model
from llm_anatomy.claims import ClaimFailed, claim, reading
from llm_anatomy.generate import decode, decode_check
from llm_anatomy.generate.chat import chat_prompt_ids
from llm_anatomy.measure import cache_speedup
from llm_anatomy.model.scratch import ScratchLlama

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cell_source(notebook: str, needle: str, shorter: tuple[str, str] | None = None) -> str:
    """The source of the one code cell of `notebook` that contains `needle`; `shorter` (old, new) makes fewer tokens,
    the rest of the cell as it is (the test stays quick)."""
    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    found = [c for c in cells if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} code cells contain {needle!r}"
    source = "".join(found[0]["source"])
    if shorter:
        assert source.count(shorter[0]) == 1, f"{notebook}: {shorter[0]!r} is not in the cell once"
        source = source.replace(*shorter)
    return source


def run_cells(*sources: str, namespace: dict) -> dict:
    with torch.no_grad():
        for source in sources:
            exec(compile(source, "<claim cell>", "exec"), namespace)
    return namespace


# 05 · C8: the cached loop, call by call, against transformers' full pass (logits at every step, tokens fed, cache)
C8_05 = ("05_generation.ipynb", "check_decode(trace", ("story_ids, 32)", "story_ids, 4)"))  # 4 steps, not 32


@pytest.fixture(scope="module")
def course05(real):
    fp32 = real if real.dtype == torch.float32 else load_model(device="cpu", dtype=torch.float32, verbose=False)
    ids = chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])  # [1, seq]
    return dict(loaded=fp32, tok=fp32.tokenizer, model=ScratchLlama.from_hf(fp32.model), prompt_ids=ids,
                load_model=load_model, ScratchLlama=ScratchLlama, chat_prompt_ids=chat_prompt_ids, claim=claim,
                torch=torch, print=lambda *a: None)


def test_05_c8_holds(course05):
    namespace = run_cells(cell_source(*C8_05), namespace=dict(course05))
    assert namespace["trace"].fed == [namespace["story_ids"].shape[1], 1, 1, 1]


@pytest.mark.counterfactual("C8", "05's cell on the real model, decode steps' RoPE positions shifted by +3")
def test_05_c8_fails_when_decode_positions_are_shifted(course05, monkeypatch):
    real_step = decode.decode_step  # the loop passes each decode step's position 3 too far
    monkeypatch.setattr(decode, "decode_step", lambda model, ids, cache, **kw: real_step(
        model, ids, cache, positions=torch.tensor([cache.length + 3], device=ids.device), **kw))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_05), namespace=dict(course05))


@pytest.mark.counterfactual("C8", "05's cell on the real model, the cached loop losing the prompt's first position")
def test_05_c8_fails_when_the_cached_loop_loses_the_first_position(course05, monkeypatch):
    real_prefill = decode.prefill
    monkeypatch.setattr(decode, "prefill", lambda model, ids, cache, **kw: real_prefill(
        model, ids[:, 1:] if cache.length == 0 else ids, cache, **kw))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_05), namespace=dict(course05))


@pytest.mark.counterfactual("C8", "05's cell on the real model, the whole text fed at every step")
def test_05_c8_fails_when_every_step_feeds_the_whole_text(course05, monkeypatch):
    real_trace = decode_check.trace_greedy
    monkeypatch.setattr(decode_check, "trace_greedy", lambda *a, **kw: real_trace(*a, **kw, use_cache=False))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_05), namespace=dict(course05))


# 06 · C8's time: on a CPU the cached run must be faster than recomputing by a margin that two uncached runs do not
# reach, the two runs timed call by call in turns, and the tokens each call fed counted where they enter the model
C8_06 = ("06_kv_cache.ipynb", "check_cache_speedup(runs")


@pytest.fixture
def course06(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    return dict(model=model, prompt=torch.tensor([[5, 6, 7, 8]]), device="cpu", NEW_TOKENS=6,
                loaded=types.SimpleNamespace(dtype=torch.float32), ON_GPU=False, claim=claim, reading=reading,
                torch=torch, print=lambda *a: None)


def _fake_seconds(monkeypatch, cached_s: float, uncached_s: float):
    """time_cache_runs with its real runs and counts, each call's seconds replaced (the tiny model's steps are too
    short to time: on it, a step is all overhead)."""
    real = cache_speedup.time_cache_runs

    def timed(*args, **kwargs):
        runs = real(*args, **kwargs)
        for name, seconds in (("with", cached_s), ("without", uncached_s)):
            steps = runs[name].generation.step_seconds
            steps[:] = [seconds] * len(steps)
        return runs
    monkeypatch.setattr(cache_speedup, "time_cache_runs", timed)


def test_06_c8_time_holds_when_the_cache_is_faster(course06, monkeypatch):
    _fake_seconds(monkeypatch, 0.01, 0.03)
    namespace = run_cells(cell_source(*C8_06), namespace=course06)
    assert namespace["speedup"] == pytest.approx(3.0)
    assert namespace["runs"]["with"].fed == [4, 1, 1, 1, 1, 1]


@pytest.mark.counterfactual("C8", "06's cell with both runs uncached (through time_cache_runs)")
def test_06_c8_time_fails_when_both_runs_are_uncached(course06, monkeypatch):
    real = cache_speedup.time_cache_runs
    monkeypatch.setattr(cache_speedup, "time_cache_runs", lambda *a, **kw: real(
        *a, **kw, uses_cache={"with": False, "without": False}))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_06), namespace=course06)


@pytest.mark.counterfactual("C8", "06's cell, a cache that feeds one token a step but saves no time")
def test_06_c8_time_fails_when_the_cache_saves_nothing(course06, monkeypatch):
    _fake_seconds(monkeypatch, 0.05, 0.05)
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_06), namespace=course06)


def test_06_c8_time_is_only_a_reading_on_a_gpu(course06, monkeypatch):
    _fake_seconds(monkeypatch, 0.05, 0.01)
    course06["ON_GPU"] = True
    verdict = run_cells(cell_source(*C8_06) + "\nverdict = check_cache_speedup(runs, on_gpu=ON_GPU)\n",
                        namespace=course06)["verdict"]
    assert "C8 holds" in str(verdict) and "0.2x faster (on a GPU the time and the tokens are a reading" in str(verdict)
