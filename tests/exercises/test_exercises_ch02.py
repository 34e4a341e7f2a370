"""Notebook 02's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

import torch

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.model import rope as rope_module
from llm_anatomy.exercises import ch02

solutions = load_solutions("ch02")


def test_solutions_pass():
    for verdict in (ch02.check_one_hot_embed(solutions.embed), ch02.check_cosine_similarity(solutions.cosine),
                    ch02.check_rope(solutions.rope)):
        assert verdict.passed, verdict.message


def test_one_hot_embed_refuses_indexing_the_table():
    not_yet(ch02.check_one_hot_embed(lambda ids, table: table[ids]), "indexing the table", "one-hot")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: table.index_select(0, ids.flatten())), "indexing the table")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.embedding(ids, table)), "indexing")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.stack([table[i] for i in ids])), "indexing")


def test_one_hot_embed_mistakes_get_specific_messages():
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.one_hot(ids, table.shape[0]).float()),
            "[4, 6]", "one row per id")
    shifted = lambda ids, table: torch.nn.functional.one_hot((ids + 1) % table.shape[0], table.shape[0]).to(table.dtype) @ table  # noqa: E731
    not_yet(ch02.check_one_hot_embed(shifted), "at the token's id")
    flat = lambda ids, table: torch.nn.functional.one_hot(ids.flatten(), table.shape[0]).to(table.dtype) @ table  # noqa: E731
    not_yet(ch02.check_one_hot_embed(flat), "[2, 3, 5]")
    not_yet(ch02.check_one_hot_embed(unattempted), "not attempted")
    not_yet(ch02.check_one_hot_embed(None), "define a function")


def test_cosine_similarity():
    not_yet(ch02.check_cosine_similarity(lambda a, b: float(a @ b)), "both lengths")
    not_yet(ch02.check_cosine_similarity(lambda a, b: [1.0]), "single number")
    abs_cosine = lambda a, b: abs(float(a @ b / (torch.linalg.norm(a) * torch.linalg.norm(b))))  # noqa: E731
    not_yet(ch02.check_cosine_similarity(abs_cosine), "do not take abs()")
    not_yet(ch02.check_cosine_similarity(unattempted), "not attempted")


def _interleaved(x, positions, theta):
    d = x.shape[-1]
    a = positions[:, None].double() / theta ** (torch.arange(0, d, 2).double() / d)
    out = x.double().clone()
    out[:, 0::2] = x[:, 0::2] * a.cos() - x[:, 1::2] * a.sin()
    out[:, 1::2] = x[:, 0::2] * a.sin() + x[:, 1::2] * a.cos()
    return out


def test_rope_mistakes_get_specific_messages():
    not_yet(ch02.check_rope(_interleaved), "neighbours", "x[j + d/2]")
    not_yet(ch02.check_rope(lambda x, p, theta: solutions.rope(x, -p, theta)), "wrong way round")
    not_yet(ch02.check_rope(lambda x, p, theta: solutions.rope(x, torch.arange(len(p)), theta)), "positions you are given")
    not_yet(ch02.check_rope(lambda x, p, theta: solutions.rope(x, p, theta ** 2)), "theta ** (-2j / head_dim)")
    not_yet(ch02.check_rope(lambda x, p, theta: 2 * solutions.rope(x, p, theta)), "lengths changed")
    not_yet(ch02.check_rope(lambda x, p, theta: x[:, :4]), "shaped like x")
    not_yet(ch02.check_rope(unattempted), "not attempted")


def test_rope_refuses_the_library_and_transformers():
    import transformers.models.llama.modeling_llama as llama

    def library(x, positions, theta):
        cos, sin = rope_module.rope_cos_sin(positions, x.shape[-1], theta)
        return rope_module.apply_rope(x[None, None], cos, sin)[0, 0]

    def theirs(x, positions, theta):
        return llama.rotate_half(x)

    not_yet(ch02.check_rope(library), "don't call")
    not_yet(ch02.check_rope(theirs), "don't call", "rotate_half")
    assert rope_module.apply_rope is not None and llama.rotate_half(torch.ones(1, 2)).tolist() == [[-1.0, 1.0]]
