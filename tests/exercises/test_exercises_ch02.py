"""Notebook 02's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

import torch

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.model import rope as rope_module
from llm_anatomy.exercises import ch02

solutions = load_solutions("ch02")


def test_solutions_pass():
    for verdict in (ch02.check_one_hot_embed(solutions.embed), ch02.check_nearest_neighbours(solutions.neighbours),
                    ch02.check_rope(solutions.rope)):
        assert verdict.passed, verdict.message


def test_one_hot_embed_refuses_indexing_the_table():
    not_yet(ch02.check_one_hot_embed(lambda ids, table: table[ids]), "indexing the table", "one-hot")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: table.index_select(0, ids.flatten())), "indexing the table")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.embedding(ids, table)), "indexing")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.stack([table[i] for i in ids])), "indexing")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.stack([table.unbind(0)[i] for i in ids.flatten()])
                                     .view(*ids.shape, -1)), "unbind")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.tensor([table.tolist()[i] for i in ids.flatten()])
                                     .view(*ids.shape, -1)), "tolist")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.stack([list(table)[i] for i in ids.flatten()])
                                     .view(*ids.shape, -1)), "one-hot")
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.cat(table.split(1))[ids]), "split")


def test_one_hot_embed_mistakes_get_specific_messages():
    not_yet(ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.one_hot(ids, table.shape[0]).float()),
            "[4, 6]", "one row per id")
    shifted = lambda ids, table: torch.nn.functional.one_hot((ids + 1) % table.shape[0], table.shape[0]).to(table.dtype) @ table  # noqa: E731
    not_yet(ch02.check_one_hot_embed(shifted), "at the token's id")
    flat = lambda ids, table: torch.nn.functional.one_hot(ids.flatten(), table.shape[0]).to(table.dtype) @ table  # noqa: E731
    not_yet(ch02.check_one_hot_embed(flat), "[2, 3, 5]")
    not_yet(ch02.check_one_hot_embed(unattempted), "not attempted")
    not_yet(ch02.check_one_hot_embed(None), "define a function")


def test_nearest_neighbours():
    def raw_dot(table, ids, k):
        sims = table[ids] @ table.T
        sims[torch.arange(len(ids)), ids] = -float("inf")
        return sims.topk(k, dim=-1).indices

    def with_self(table, ids, k):
        unit = table / table.norm(dim=-1, keepdim=True)
        return (unit[ids] @ unit.T).topk(k, dim=-1).indices

    def absolute(table, ids, k):
        unit = table / table.norm(dim=-1, keepdim=True)
        sims = (unit[ids] @ unit.T).abs()
        sims[torch.arange(len(ids)), ids] = -2.0
        return sims.topk(k, dim=-1).indices

    def least(table, ids, k):
        unit = table / table.norm(dim=-1, keepdim=True)
        sims = unit[ids] @ unit.T
        sims[torch.arange(len(ids)), ids] = 2.0
        return sims.topk(k, dim=-1, largest=False).indices

    def one_query_at_a_time(table, ids, k):  # the right neighbours, but a loop over the queries
        unit = table / table.norm(dim=-1, keepdim=True)
        rows = []
        for i in ids.tolist():
            sims = unit @ unit[i]  # [vocab]
            sims[i] = -2.0
            rows.append(sims.topk(k).indices)
        return torch.stack(rows)

    def one_row_at_a_time(table, ids, k):  # the right neighbours, but a loop over the table's rows
        unit = table / table.norm(dim=-1, keepdim=True)
        sims = torch.stack([(unit[ids] * row).sum(-1) for row in unit], dim=1)  # [queries, vocab]
        sims[torch.arange(len(ids)), ids] = -2.0
        return sims.topk(k, dim=-1).indices

    def library(table, ids, k):
        from llm_anatomy.model.embeddings import nearest_neighbours

        return torch.tensor([[n.token_id for n in nearest_neighbours(table, int(i), k)] for i in ids])

    def via_functional(table, ids, k):
        sims = torch.nn.functional.cosine_similarity(table[ids][:, None], table[None], dim=-1)
        sims[torch.arange(len(ids)), ids] = -2.0
        return sims.topk(k, dim=-1).indices

    not_yet(ch02.check_nearest_neighbours(raw_dot), "raw dot product", "length")
    not_yet(ch02.check_nearest_neighbours(with_self), "itself")
    not_yet(ch02.check_nearest_neighbours(absolute), "abs(cos)")
    not_yet(ch02.check_nearest_neighbours(least), "least similar")
    not_yet(ch02.check_nearest_neighbours(lambda t, i, k: solutions.neighbours(t, i, k).flip(-1)), "wrong order")
    not_yet(ch02.check_nearest_neighbours(lambda t, i, k: solutions.neighbours(t, i, k + 1)), "shape")
    not_yet(ch02.check_nearest_neighbours(lambda t, i, k: (t[i] @ t.T).topk(k).values), "ids")
    not_yet(ch02.check_nearest_neighbours(library), "don't call", "nearest_neighbours")
    not_yet(ch02.check_nearest_neighbours(one_query_at_a_time), "one matrix product", "a Python loop")
    not_yet(ch02.check_nearest_neighbours(one_row_at_a_time), "one matrix product", "a Python loop")
    not_yet(ch02.check_nearest_neighbours(via_functional), "don't call", "cosine_similarity")
    not_yet(ch02.check_nearest_neighbours(unattempted), "not attempted")
    not_yet(ch02.check_nearest_neighbours(None), "define a function")


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
