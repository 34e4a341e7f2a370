"""The claim cells of notebooks 02-04, run as the notebook holds them, on the real model: each holds, and each fails
(ClaimFailed) when its evidence is broken on purpose (tests/test_claims.py shows the same for a whole notebook run).

Each claim cell here imports what it uses and reads only a few names the notebook made above it (the model, the
prompt's ids), so a test can run the cell's own source with those names and a piece of the evidence swapped."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.model import ablations
from llm_anatomy.model.scratch import ScratchLlama

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cell_source(notebook: str, needle: str) -> str:
    """The source of the one code cell of `notebook` that contains `needle`."""
    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    found = [c for c in cells if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} code cells contain {needle!r}"
    return "".join(found[0]["source"])


def run_cell(source: str, **names) -> dict:
    namespace = {"claim": claim, "torch": torch, **names}
    with torch.no_grad():
        exec(compile(source, "<claim cell>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def course(real):
    torch.set_grad_enabled(False)
    model = real.model if real.dtype == torch.float32 else copy.deepcopy(real.model).float()
    return dict(model=model, scratch=ScratchLlama.from_hf(model), tok=real.tokenizer, loaded=real)


def _ids(course, text):
    return course["tok"](text, return_tensors="pt").input_ids  # [1, seq]


# 04 · C5: the grouping that matches transformers is h // 3, not h % 3; repeat_kv's copies change nothing
GQA = ("04_forward_pass.ipynb", 'claim("C5"')


def _gqa_names(course):
    return dict(course, ids=_ids(course, "The capital of France is"))


def test_04_gqa_ablation_holds(course):
    namespace = run_cell(cell_source(*GQA), **_gqa_names(course))
    assert namespace["wrong_change"] > 0.1 and namespace["copy_change"] <= 1e-5


def test_04_gqa_ablation_fails_when_the_wrong_grouping_is_the_true_one(course, monkeypatch):
    real_read = ablations.kv_heads_read
    heads, kv = course["scratch"].cfg.num_heads, course["scratch"].cfg.num_kv_heads
    monkeypatch.setattr(ablations, "kv_heads_read",
                        lambda model, _: real_read(model, [h // (heads // kv) for h in range(heads)]))
    with pytest.raises(ClaimFailed, match="C5 NOT shown"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


def test_04_gqa_ablation_fails_when_the_copy_deals_the_heads_out_wrongly(course, monkeypatch):
    monkeypatch.setattr(ablations, "repeat_kv", lambda x, n_rep: x.repeat(1, n_rep, 1, 1))  # tiles: head h gets h % 3
    with pytest.raises(ClaimFailed, match="C5 NOT shown"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


def test_04_gqa_ablation_refuses_a_change_that_never_reaches_the_model(course, monkeypatch):
    monkeypatch.setattr(ablations, "_attention_replaced", lambda model, replacement: contextlib.nullcontext([]))
    with pytest.raises(Exception, match="reached 0 attention calls"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


# 03 · C9 over the whole model: with the mask, cached decode is the full pass; without it, they part from block 1 on
CACHE = ("03_attention.ipynb", "cached_vs_full(scratch32, ids, masked=True)")


def _cache_names(course):
    return dict(model=course["model"], loaded=course["loaded"],
                ids=_ids(course, "The cat sat on the mat because it was tired."))


def test_03_whole_model_mask_claim_holds(course):
    namespace = run_cell(cell_source(*CACHE), **_cache_names(course))
    assert namespace["off"].per_layer[0] <= 1e-4 < namespace["off"].per_layer[1]


def test_03_whole_model_mask_claim_fails_when_switching_the_mask_off_changes_nothing(course, monkeypatch):
    monkeypatch.setattr(ablations, "mask_off", lambda model: contextlib.nullcontext([1] * 3 * model.cfg.num_layers))
    with pytest.raises(ClaimFailed, match="C9 NOT shown"):
        run_cell(cell_source(*CACHE), **_cache_names(course))


def test_03_whole_model_mask_claim_fails_for_a_model_without_a_causal_mask(course, monkeypatch):
    from llm_anatomy.model import scratch as scratch_module

    real_attention = scratch_module.attention
    monkeypatch.setattr(scratch_module, "attention", lambda q, k, v, **kw: real_attention(q, k, v, **{**kw, "causal": False}))
    with pytest.raises(ClaimFailed, match="C9 NOT shown"):
        run_cell(cell_source(*CACHE), **_cache_names(course))


# 03 · C5: the heads of one layer look for different relations (per-head statistics, deterministic in fp32)
HEADS = ("03_attention.ipynb", "to_previous, to_itself = int(previous.argmax())")


def _heads_names(course, weights=None):
    text_ids = _ids(course, "The cat sat on the mat because it was tired. The cat")
    w = course["scratch"].attention_weights(text_ids, 11)[0] if weights is None else weights  # [9, seq, seq]
    return dict(w=w, H=course["scratch"].cfg.num_heads, layer=11)


def test_03_head_statistics_claim_holds(course):
    namespace = run_cell(cell_source(*HEADS), **_heads_names(course))
    assert namespace["to_previous"] != namespace["to_itself"]


def test_03_head_statistics_claim_fails_when_every_head_looks_alike(course):
    w = _heads_names(course)["w"]
    alike = w[1:2].expand_as(w).clone()  # every head a copy of head 1
    with pytest.raises(ClaimFailed, match="C5 NOT shown"):
        run_cell(cell_source(*HEADS), **_heads_names(course, alike))
    seq = w.shape[-1]
    uniform = torch.ones(seq, seq).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand_as(w)  # every query spreads its weight evenly
    with pytest.raises(ClaimFailed, match="C5 NOT shown"):
        run_cell(cell_source(*HEADS), **_heads_names(course, uniform))

