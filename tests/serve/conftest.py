"""What the serving tests share: a tiny random-weight model and a trace of twelve requests (tokens under 128)."""

from __future__ import annotations

import pytest

from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.serve.metrics import poisson_trace
from llm_anatomy.weights.random import random_llama


@pytest.fixture(scope="module")
def tiny():
    return ScratchLlama.from_hf(random_llama())


@pytest.fixture(scope="module")
def trace():
    return poisson_trace(12, 40.0, [1, 3, 5, 9, 17], [1, 2, 4, 12], seed=3, vocab_size=128)
