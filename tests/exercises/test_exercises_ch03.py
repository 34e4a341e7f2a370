"""Notebook 03's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import torch

from exercise_helpers import load_solutions, not_yet as _not_yet, unattempted as _unattempted

from llm_anatomy.exercises import ch03

solutions = load_solutions("ch03")


def test_causal_mask():
    assert ch03.check_causal_mask(solutions.mask).passed
    _not_yet(ch03.check_causal_mask(lambda n: torch.ones(n, n, dtype=torch.bool).triu()), "other triangle")
    _not_yet(ch03.check_causal_mask(lambda n: torch.ones(n, n).tril()), "torch.bool")
    _not_yet(ch03.check_causal_mask(lambda n: torch.ones(n, n, dtype=torch.bool)), "tril")
    _not_yet(ch03.check_causal_mask(_unattempted), "not attempted")


def test_one_head():
    assert ch03.check_one_head(solutions.attend).passed
    no_mask = lambda q, k, v: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v  # noqa: E731
    _not_yet(ch03.check_one_head(no_mask), "causal mask")
    unscaled = lambda q, k, v: torch.softmax((q @ k.T).masked_fill(~solutions.mask(len(q)), float("-inf")), -1) @ v  # noqa: E731
    _not_yet(ch03.check_one_head(unscaled), "sqrt(head_dim)")
    _not_yet(ch03.check_one_head(lambda q, k, v: q), "softmax")
    _not_yet(ch03.check_one_head(lambda q, k, v: q[0]), "[seq, head_dim]")


def test_kv_head():
    assert ch03.check_kv_head(solutions.kv_head).passed
    _not_yet(ch03.check_kv_head(1), "heads 3-5")
    _not_yet(ch03.check_kv_head(None), "assign")
    _not_yet(ch03.check_kv_head(2.0), "whole number")
