"""The C8 claim cells of notebooks 05 and 06, run as the notebooks hold them: each holds, and each fails (ClaimFailed)
when its evidence is broken on purpose (tests/test_claim_cells.py does the same for 02-04)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from llm_anatomy import load_model
from llm_anatomy.claims import ClaimFailed, claim, reading
from llm_anatomy.generate import decode
from llm_anatomy.generate.chat import chat_prompt_ids
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


# 05 · C8: the append-and-rerun loop, the cached loop and transformers' generate give the same greedy tokens
LOOP = ("05_generation.ipynb", "def append_and_rerun", ("prompt_ids, 10)", "prompt_ids, 4)"))
C8_05 = ("05_generation.ipynb", 'claim("C8"', ("n = 10", "n = 4"))  # 4 greedy tokens, not 10


@pytest.fixture(scope="module")
def course05(real):
    fp32 = real if real.dtype == torch.float32 else load_model(device="cpu", dtype=torch.float32, verbose=False)
    ids = chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "Name a colour."}])  # [1, seq]
    names = dict(loaded=fp32, tok=fp32.tokenizer, model=ScratchLlama.from_hf(fp32.model), prompt_ids=ids,
                 load_model=load_model, ScratchLlama=ScratchLlama, claim=claim, torch=torch, print=lambda *a: None)
    return run_cells(cell_source(*LOOP), namespace=names)  # the plain loop's tokens, made once: new_ids


def test_05_c8_holds(course05):
    namespace = run_cells(cell_source(*C8_05), namespace=dict(course05))
    assert namespace["plain"] == namespace["cached"]


def test_05_c8_fails_when_the_cached_loop_loses_the_first_position(course05, monkeypatch):
    real_loop = decode.generate_greedy
    monkeypatch.setattr(decode, "generate_greedy", lambda model, ids, n, **kw: real_loop(model, ids[:, 1:], n, **kw))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_05), namespace=dict(course05))


def test_05_c8_fails_when_the_plain_loop_made_other_tokens(course05):
    namespace = dict(course05)
    namespace["new_ids"] = [namespace["new_ids"][1]] + namespace["new_ids"][1:]  # another first token
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_05), namespace=namespace)


# 06 · C8's time: on a CPU the cached run must be faster than recomputing, the two runs timed call by call in turns
# (the fed tokens are counted beside it)
C8_06 = ("06_kv_cache.ipynb", 'claim("C8"')


@pytest.fixture
def timed_runs(monkeypatch):
    """The 06 C8 cell's names, with the interleaved timer replaced by one that reports the given step times."""
    from llm_anatomy.generate.decode import Generation
    from llm_anatomy.measure import timing

    def runs(cached_s: float, uncached_s: float):
        tokens = torch.arange(8)[None]  # [1, new tokens]
        calls = []

        def fake_interleaved(generations, device):
            calls.append(sorted(generations))
            return {"with": Generation(tokens, [cached_s] * 8), "without": Generation(tokens, [uncached_s] * 8)}

        monkeypatch.setattr(timing, "time_generations_interleaved", fake_interleaved)
        return dict(model=None, prompt=torch.zeros(1, 5, dtype=torch.long), device="cpu", NEW_TOKENS=8,
                    loaded=types.SimpleNamespace(dtype=torch.float32), ON_GPU=False, claim=claim, reading=reading,
                    torch=torch, print=lambda *a: None, calls=calls)

    return runs


def test_06_c8_time_holds_when_the_cache_is_faster(timed_runs):
    namespace = run_cells(cell_source(*C8_06), namespace=timed_runs(0.01, 0.05))
    assert namespace["speedup"] == pytest.approx(5.0)
    assert namespace["calls"] == [["with", "without"]]  # both runs went to the interleaved timer together


def test_06_c8_time_fails_when_the_cache_saves_nothing(timed_runs):
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        run_cells(cell_source(*C8_06), namespace=timed_runs(0.05, 0.05))


def test_06_c8_time_is_only_a_reading_on_a_gpu(timed_runs):
    namespace = timed_runs(0.05, 0.01)
    namespace["ON_GPU"], said = True, []
    namespace["reading"] = lambda number, evidence: said.append((number, evidence))
    namespace["claim"] = lambda *a: pytest.fail("on a GPU the cell asserts no time")
    run_cells(cell_source(*C8_06), namespace=namespace)  # no ClaimFailed: the prose reads the sign there
    assert [n for n, _ in said] == ["C8"] and "0.2x faster" in said[0][1]  # the slower cache is reported as it was


# 07 · C12: TTFT grows with the prompt (the fastest prefills of lengths timed in turns) and exceeds a decode step
C12_07 = ("07_prefill_and_decode.ipynb", 'claim("C12"')


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


def _timings_growing_with(seconds_per_token: float, seen: list, base_s: float = 0.0):
    """A stand-in for time_generations whose prefill takes base_s + seconds_per_token per prompt token (decode 1 ms):
    on the tiny model the real prefills of 4 and 40 tokens differ by less than a busy machine's noise."""
    from llm_anatomy.measure.timing import GenerationTiming

    def timed(model, prompts, new_tokens, warmup, repeats):
        seen.append(sorted(prompts))
        prefill = {n: base_s + seconds_per_token * n for n in prompts}
        return {n: GenerationTiming(ids.shape[1], new_tokens, 1, prefill[n], 0.001,
                                    [prefill[n]] + [0.001] * (new_tokens - 1), [prefill[n]] * repeats)
                for n, ids in prompts.items()}
    return timed


def test_07_c12_holds_on_the_prompt_lengths_timed_in_turns(course07):
    seen = []
    course07["time_generations"] = _timings_growing_with(1e-4, seen)
    namespace = run_cells(cell_source(*C12_07), namespace=course07)
    assert seen == [[4, 40]] and set(namespace["timings"]) == {4, 40}  # every length in one interleaved timing


def test_07_c12_fails_when_the_long_prompt_is_no_slower(course07):
    course07["time_generations"] = _timings_growing_with(0.0, [], base_s=0.01)  # 10 ms whatever the length
    with pytest.raises(ClaimFailed, match="C12 FAILED"):
        run_cells(cell_source(*C12_07), namespace=course07)
