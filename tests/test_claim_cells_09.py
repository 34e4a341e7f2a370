"""Notebook 09's claim checks on the real model, in the true world and in counterfactual worlds (C17): the Q4_1 cell
run as the notebook holds it, with the hand decoding or the library's broken on purpose; int8's quality bar with
int8 rounding right and wrong. The speed half (tests/fast/test_packed.py), C18 (tests/fast/test_speculative.py), C19
(tests/fast/test_tiled_attention.py) and C20 (tests/fast/test_fused.py) are tested beside their library functions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.fast import gguf_blocks
from llm_anatomy.fast import quantize as q
from llm_anatomy.model.scratch import ScratchLlama

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "09_making_decode_fast.ipynb"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cells(*needles: str) -> str:
    """The sources of the code cells holding each needle, in the order given, joined."""
    found = []
    for needle in needles:
        hits = [c for c in json.loads(NOTEBOOK.read_text())["cells"]
                if c["cell_type"] == "code" and needle in "".join(c["source"])]
        assert len(hits) == 1, f"{len(hits)} code cells contain {needle!r}"
        found.append("".join(hits[0]["source"]))
    return "\n".join(found)


@pytest.fixture(scope="module")
def scratch(real):
    return ScratchLlama.from_hf(real.model)


# C17: the Q4_1 block read by hand (cells 1.1), and the library's decoding of whole tensors, against gguf and the cache
Q4_1_CELLS = ("gguf_summary(path).items()", "block = raw[:20]", "same_layout = {")
HAND_SCALE = "weights = d * codes + m"
HAND_NIBBLES = "codes = np.concatenate([block[4:] & 0x0F, block[4:] >> 4])"


def run_q4_1(scratch, source):
    namespace = {"np": np, "claim": claim, "model": scratch, "print": lambda *a, **k: None}
    exec(compile(source, "<09 Q4_1 cells>", "exec"), namespace)
    return namespace


def test_the_q4_1_cells_hold(scratch):
    assert run_q4_1(scratch, cells(*Q4_1_CELLS))["results"]


@pytest.mark.counterfactual("C17", "Q4_1 read by hand with the scale and the minimum swapped (m * code + d)")
def test_the_q4_1_cell_fails_with_scale_and_minimum_swapped(scratch):
    source = cells(*Q4_1_CELLS)
    assert HAND_SCALE in source
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        run_q4_1(scratch, source.replace(HAND_SCALE, "weights = m * codes + d"))


@pytest.mark.counterfactual("C17", "Q4_1 read by hand with the nibbles in the wrong order (high half first)")
def test_the_q4_1_cell_fails_with_the_nibbles_swapped(scratch):
    source = cells(*Q4_1_CELLS)
    assert HAND_NIBBLES in source
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        run_q4_1(scratch, source.replace(HAND_NIBBLES, "codes = np.concatenate([block[4:] >> 4, block[4:] & 0x0F])"))


@pytest.mark.counterfactual("C17", "the library's Q4_1 decoder swaps each block's scale and minimum")
def test_the_q4_1_cell_fails_when_the_library_swaps_scale_and_minimum(scratch, monkeypatch):
    right = gguf_blocks.q4_1_blocks

    def swapped(raw):
        d, m, codes = right(raw)
        return m, d, codes
    monkeypatch.setattr(gguf_blocks, "q4_1_blocks", swapped)
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        run_q4_1(scratch, cells(*Q4_1_CELLS))


# C17: int8's quality bar on the notebook's passage, with the notebook's own functions
@pytest.fixture(scope="module")
def passage_and_reference(real, scratch):
    from pydoc_data.topics import topics

    passage = real.tokenizer(topics["assignment"], return_tensors="pt").input_ids[:, :256]  # the notebook's CPU run
    with torch.no_grad():
        return passage, scratch(passage)


def _int8_evidence(scratch, passage, reference):
    from llm_anatomy.measure.quality import greedy_agreement, logit_kl

    with q.quantize_model_weights(scratch, "int8", 32, head_fmt="int8") as changed, torch.no_grad():
        logits = scratch(passage)
    per_token = {"fp32": q.weight_bytes_per_token(scratch, "fp32"), "int8": q.weight_bytes_per_token(scratch, "int8"),
                 "int4": q.weight_bytes_per_token(scratch, "int4", 32, head_fmt="int8")}
    return q.quantization_evidence(per_token, per_token, logit_kl(reference, logits),
                                   greedy_agreement(reference.argmax(-1), logits.argmax(-1)), changed=changed,
                                   should_change=q.linear_weight_count(scratch.cfg))


def test_int8_meets_its_quality_bar(scratch, passage_and_reference):
    claim("C17", *_int8_evidence(scratch, *passage_and_reference))


@pytest.mark.counterfactual("C17", "int8 codes truncated toward zero instead of rounded (KL 0.019 nats, 91% agree)")
def test_the_quality_check_fails_for_truncated_int8(scratch, passage_and_reference, monkeypatch):
    def truncated(w):
        w = w.detach().float()
        scale = w.abs().amax(dim=1) / 127
        return (w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale  # .to(int8) truncates
    monkeypatch.setattr(q, "quantize_int8_per_channel", truncated)
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        claim("C17", *_int8_evidence(scratch, *passage_and_reference))


@pytest.mark.counterfactual("C17", "a fake quantizer that changes nothing (every weight rounded to itself, real model)")
def test_the_quality_check_fails_for_a_quantizer_that_changes_nothing(scratch, passage_and_reference, monkeypatch):
    monkeypatch.setattr(q, "fake_quantize", lambda w, fmt, group_size=32: w.detach().clone())  # KL 0, all agree
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        claim("C17", *_int8_evidence(scratch, *passage_and_reference))
