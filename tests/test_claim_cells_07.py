"""Notebook 07's claim cells in worlds where their claims are false (issue 44): each must raise ClaimFailed.

C6 and C11 are checked by library functions (measure/roofline.py), whose true and false worlds tests/measure/
test_roofline.py runs on measured figures. Here: the C12 cell itself, run as the notebook holds it on a tiny model,
with its timer or its prefill replaced by those of a world without the mechanism. And the C6 and C11 cells' sources,
which must call those library checks.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.model.scratch import ScratchLlama

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_prefill_and_decode.ipynb"


def cell_source(needle: str) -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    found = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert len(found) == 1, f"{len(found)} code cells of 07 contain {needle!r}"
    return found[0]


def run_cell(source: str, namespace: dict) -> dict:
    with torch.no_grad():
        exec(compile(source, "<07 claim cell>", "exec"), namespace)
    return namespace


@pytest.fixture
def course07(tiny_model):
    from llm_anatomy.generate.decode import prefill
    from llm_anatomy.measure.timing import time_generations
    from llm_anatomy.model.kv_cache import kv_cache_bytes

    model = ScratchLlama.from_hf(tiny_model)
    return dict(model=model, cfg=model.cfg, loaded=types.SimpleNamespace(config=tiny_model.config), device="cpu",
                dtype=torch.float32, BYTES=4, PROMPT_LENGTHS=[4, 40], NEW=3, REPEATS=2, claim=claim, torch=torch,
                display=lambda *a: None, print=lambda *a: None, prefill=prefill, time_generations=time_generations,
                kv_cache_bytes=kv_cache_bytes)


def timer(prefill_s, decode_s: float = 0.001, seen: list | None = None):
    """A stand-in for time_generations: the prefill of n tokens takes prefill_s(n), every decode step decode_s (on the
    tiny model the real prefills of 4 and 40 tokens differ by less than a busy machine's noise). `seen` collects the
    prompt lengths of each call."""
    from llm_anatomy.measure.timing import GenerationTiming

    def timed(model, prompts, new_tokens, warmup, repeats):
        if seen is not None:
            seen.append(sorted(prompts))
        return {n: GenerationTiming(ids.shape[1], new_tokens, 1, prefill_s(n), decode_s,
                                    [prefill_s(n)] + [decode_s] * (new_tokens - 1), [prefill_s(n)] * repeats)
                for n, ids in prompts.items()}
    return timed


C12 = 'claim("C12"'


def test_07_c12_holds_when_ttft_grows_and_exceeds_a_step(course07):
    seen = []
    course07["time_generations"] = timer(lambda n: 0.002 + 1e-4 * n, seen=seen)  # 2.4 and 6 ms against 1 ms steps
    namespace = run_cell(cell_source(C12), course07)
    assert seen == [[4, 40]] and set(namespace["timings"]) == {4, 40}  # every length in one interleaved timing


@pytest.mark.counterfactual("C12", "a prefill whose time does not grow with the prompt (10 ms at any length)")
def test_07_c12_fails_when_the_long_prompt_is_no_slower(course07):
    course07["time_generations"] = timer(lambda n: 0.01)  # 10 ms whatever the length
    with pytest.raises(ClaimFailed, match="C12 FAILED"):
        run_cell(cell_source(C12), course07)


@pytest.mark.counterfactual("C12", "a first token no slower than the rest (TTFT grows, but stays under a decode step)")
def test_07_c12_fails_when_ttft_does_not_exceed_a_step(course07):
    course07["time_generations"] = timer(lambda n: 1e-5 * n)  # 0.04 and 0.4 ms: it grows, under the 1 ms step
    with pytest.raises(ClaimFailed, match="C12 FAILED"):
        run_cell(cell_source(C12), course07)


@pytest.mark.counterfactual("C12", "a prefill that never writes the cache (a chat that costs no memory)")
def test_07_c12_fails_when_the_prefill_stores_nothing(course07):
    course07["time_generations"] = timer(lambda n: 0.002 + 1e-4 * n)
    course07["prefill"] = lambda model, ids, cache, **kw: model.trace(ids, None, keep_hidden=False, logits_to_keep=1)
    with pytest.raises(ClaimFailed, match="C12 FAILED.*0 positions hold"):
        run_cell(cell_source(C12), course07)


@pytest.mark.counterfactual("C12", "a prefill that advances the cache's length but writes no K/V (or only layer 0)")
def test_07_c12_fails_when_the_prefill_advances_the_length_without_writing(course07):
    from llm_anatomy.generate.decode import prefill

    course07["time_generations"] = timer(lambda n: 0.002 + 1e-4 * n)

    def advances_only(model, ids, cache, **kw):
        model.trace(ids, None, keep_hidden=False, logits_to_keep=1)
        cache.advance(ids.shape[1])  # the length says the prompt is there; the tensors hold zeros

    course07["prefill"] = advances_only
    with pytest.raises(ClaimFailed, match="C12 FAILED.*0 positions hold"):
        run_cell(cell_source(C12), course07)

    def first_layer_only(model, ids, cache, **kw):
        prefill(model, ids, cache, **kw)
        for t in cache.keys[1:] + cache.values[1:]:
            t.zero_()

    course07["prefill"] = first_layer_only
    with pytest.raises(ClaimFailed, match="C12 FAILED.*0 positions hold"):
        run_cell(cell_source(C12), course07)


@pytest.mark.counterfactual("C12", "a prefill whose time grows only a little with the prompt (1.5x for 10x the tokens)")
def test_07_c12_fails_when_ttft_grows_too_little(course07):
    course07["time_generations"] = timer(lambda n: 0.01 + 1.4e-5 * n)  # 10.06 and 10.56 ms: 1.05x for 10x the tokens
    with pytest.raises(ClaimFailed, match="C12 FAILED"):
        run_cell(cell_source(C12), course07)
    course07["time_generations"] = timer(lambda n: 0.004 * (1 + n / 72))  # 1.5x between 4 and 40 tokens
    with pytest.raises(ClaimFailed, match="C12 FAILED"):
        run_cell(cell_source(C12), course07)


def test_07_c6_and_c11_cells_call_the_library_checks():
    """The checks that tests/measure/test_roofline.py runs in their false worlds are the ones the cells call, on the
    op-by-op bytes (activations=True) and, for C11, on the bytes traced from the real step."""
    c6 = cell_source("claim_prefill_parallel(")
    assert "claim_compute_bound(c6_peaks, long_work" in c6 and "measured_in_turns(" in c6
    assert "long_work = forward_work(cfg, longest, 0, 1, BYTES, activations=True)" in c6
    assert 'claim("C6"' not in c6  # no inline check beside them
    c11 = cell_source("claim_memory_bound(")
    assert "traced_bytes(c11_step)" in c11 and "activations=True" in c11 and "measured_in_turns(" in c11
    sources = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    assert not any('claim("C11"' in s or 'claim("C6"' in s for s in sources)
