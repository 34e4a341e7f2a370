"""The quality measures (measure/quality.py) on values worked out by hand, and perplexity on the real model."""

from __future__ import annotations

import math

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.quality import greedy_agreement, logit_kl, perplexity


def test_quality_measures_on_known_values():
    ref = torch.log(torch.tensor([[0.5, 0.5]]))
    other = torch.log(torch.tensor([[0.9, 0.1]]))
    assert logit_kl(ref, ref) == 0.0
    assert logit_kl(ref, other) == pytest.approx(0.5 * math.log(25 / 9), rel=1e-5)
    assert greedy_agreement([1, 2, 3, 4], torch.tensor([1, 2, 0, 4])) == 0.75
    with pytest.raises(CourseError):
        greedy_agreement([1, 2], [1, 2, 3])
    with pytest.raises(CourseError, match="one shape"):
        logit_kl(ref, torch.zeros(1, 3))
    uniform = lambda ids: torch.zeros(1, ids.shape[-1], 10)  # noqa: E731  a model that guesses among 10
    assert perplexity(uniform, torch.tensor([1, 2, 3, 4])) == pytest.approx(10.0)
    with pytest.raises(CourseError, match="two tokens"):
        perplexity(uniform, torch.tensor([1]))


def test_perplexity_of_natural_text(real):
    from llm_anatomy.model.scratch import ScratchLlama
    from llm_anatomy.texts import python_topic

    scratch = ScratchLlama.from_hf(real.model)
    passage = real.tokenizer(python_topic("assignment"), return_tensors="pt").input_ids[:, :96]  # [1, 96]
    ppl = perplexity(scratch, passage)
    with torch.no_grad():  # the same number the plain way: exp of the mean cross-entropy of each next token
        logits = real.model(passage).logits[0, :-1].float()
    assert ppl == pytest.approx(math.exp(torch.nn.functional.cross_entropy(logits, passage[0, 1:])), rel=1e-4)
    shuffled = passage[:, torch.randperm(96, generator=torch.Generator().manual_seed(0))]
    assert perplexity(scratch, shuffled) > 5 * ppl  # text is predictable; the same tokens shuffled are not
    assert perplexity(real.model, passage[:, :24]) == pytest.approx(perplexity(scratch, passage[:, :24]), rel=1e-4)
