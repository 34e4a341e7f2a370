"""Notebook 02's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import torch

from exercise_helpers import load_solutions, not_yet as _not_yet, unattempted as _unattempted

from llm_anatomy.exercises import ch02

solutions = load_solutions("ch02")


def test_one_hot_embed():
    assert ch02.check_one_hot_embed(solutions.embed).passed
    _not_yet(ch02.check_one_hot_embed(_unattempted), "not attempted")
    _not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.one_hot(ids, table.shape[0]).float()),
             "[4, 6]")
    _not_yet(ch02.check_one_hot_embed(lambda ids, table: table[ids + 1]), "one_hot")
    _not_yet(ch02.check_one_hot_embed(None), "define a function")


def test_cosine_similarity():
    assert ch02.check_cosine_similarity(solutions.cosine).passed
    _not_yet(ch02.check_cosine_similarity(lambda a, b: float(a @ b)), "both lengths")
    _not_yet(ch02.check_cosine_similarity(lambda a, b: [1.0]), "single number")
    _not_yet(ch02.check_cosine_similarity(_unattempted), "not attempted")


def test_rope_frequencies():
    assert ch02.check_rope_frequencies(solutions.frequencies).passed
    _not_yet(ch02.check_rope_frequencies(lambda d, theta: 1.0 / theta ** (torch.arange(1, d, 2) / d)), "1 radian")
    _not_yet(ch02.check_rope_frequencies(lambda d, theta: theta ** (torch.arange(0, d, 2) / d)), "differ")
    _not_yet(ch02.check_rope_frequencies(lambda d, theta: 1.0 / theta ** (torch.arange(d) / d)), "32 pairs")
    _not_yet(ch02.check_rope_frequencies(lambda d, theta: 1.0 / theta ** (torch.arange(0, d, 2) / (2 * d))),
             "theta ** (-2i / head_dim)")
