"""sampling_check.py: notebook 09's end-to-end evidence for C18 holds with the real rule, and fails when the loop keeps
every draft (its evidence broken on purpose); bad input gets one clear sentence."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.fast import speculative
from llm_anatomy.fast.sampling_check import end_to_end_sampling, second_token_marginal
from llm_anatomy.fast.speculative import LayerSkipDraft
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.random import random_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py
IDS = torch.tensor([[5, 9, 17, 4]])  # the notebook's prompt


@pytest.fixture(scope="module")
def pair():
    """The notebook's set-up: a tiny random model and another random model as its (bad) draft."""
    small = ScratchLlama.from_hf(random_llama("tiny", seed=3, vocab_size=32))
    other = ScratchLlama.from_hf(random_llama("tiny", seed=4, vocab_size=32))
    return small, LayerSkipDraft(other, range(other.cfg.num_layers))


def test_the_marginal_is_a_distribution_and_the_control_differs(pair):
    small, draft = pair
    model, control = second_token_marginal(small, IDS, 0.3), second_token_marginal(small, IDS, 0.3, draft.model)
    assert model.shape == (32,) and abs(float(model.sum()) - 1) < 1e-5 and abs(float(control.sum()) - 1) < 1e-5
    assert 0.5 * float((model - control).abs().sum()) > 0.1  # far enough apart for 300 draws to tell


def test_the_evidence_holds_with_the_real_rule(pair):
    small, draft = pair
    found = end_to_end_sampling(small, IDS, draft, draws=300, temperature=0.3)
    assert found.holds, found.evidence()
    assert 0 < found.acceptance < 1


@pytest.mark.counterfactual("C18", "the whole sampling loop keeps every draft (09's end-to-end second-token test)")
def test_the_evidence_fails_when_the_loop_keeps_every_draft(pair, monkeypatch):
    from llm_anatomy.claims import ClaimFailed, claim

    small, draft = pair
    monkeypatch.setattr(speculative, "accept_or_resample",
                        lambda p, q, drafts, generator=None: (torch.ones_like(drafts, dtype=torch.bool), drafts))
    found = end_to_end_sampling(small, IDS, draft, draws=300, temperature=0.3)
    assert not found.holds and found.against_model.p_value < 1e-3, found.evidence()
    with pytest.raises(ClaimFailed, match="C18 FAILED"):
        claim("C18", found.holds, found.evidence())  # the notebook's cell: claim("C18", e2e.holds, e2e.evidence())


def test_bad_input_is_refused(pair):
    small, draft = pair
    with pytest.raises(CourseError, match="at least 50"):
        end_to_end_sampling(small, IDS, draft, draws=10)
    big = ScratchLlama.from_hf(random_llama("tiny", seed=3, vocab_size=8192))
    with pytest.raises(CourseError, match="too many"):
        second_token_marginal(big, IDS, 1.0)
