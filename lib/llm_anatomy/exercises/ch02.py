"""Checks for notebook 02 (embeddings and positions)."""

from __future__ import annotations

import torch

from . import call, exercise, expect


def _table(seed: int = 0) -> torch.Tensor:
    return torch.randn(11, 6, generator=torch.Generator().manual_seed(seed))  # a small [vocab, hidden] table


@exercise
def check_one_hot_embed(embed) -> str:
    """Exercise 2.1: embed(ids, table) with a one-hot matrix product, not indexing."""
    expect(callable(embed), "define a function embed(ids, table) that returns one vector per id.")
    table, ids = _table(), torch.tensor([3, 0, 7, 3])
    out = call(embed, ids, table)
    expect(isinstance(out, torch.Tensor), f"return a tensor, not {type(out).__name__}.")
    expect(tuple(out.shape) == (4, 6), f"for 4 ids and a [11, 6] table the result is [4, 6], not {tuple(out.shape)}. "
                                       "Hint: one_hot(ids, vocab) is [4, 11]; [4, 11] @ [11, 6] is [4, 6].")
    expect(torch.allclose(out.float(), table[ids], atol=1e-6),
           "the vectors are not the table's rows. "
           "Hint: torch.nn.functional.one_hot(ids, table.shape[0]).float() @ table.")
    return "a one-hot row times the table picks exactly that token's row: the lookup is a matrix product."


@exercise
def check_cosine_similarity(cosine) -> str:
    """Exercise 2.2: cosine(a, b) = a.b / (|a| |b|), a float from -1 to 1."""
    expect(callable(cosine), "define a function cosine(a, b) that returns a number.")
    a, b = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([2.0, 0.0, 1.0])
    value = call(cosine, a, b)
    one_number = isinstance(value, (int, float, torch.Tensor)) and torch.as_tensor(value).numel() == 1
    value = float(value) if one_number else None
    expect(value is not None, "return a single number (a float or a one-element tensor).")
    expect(abs(value - 4 / (3 * 5 ** 0.5)) < 1e-5,
           f"cosine([1,2,2], [2,0,1]) should be 4 / (3 * sqrt(5)) = {4 / (3 * 5 ** 0.5):.4f}, not {value:.4f}. "
           "Hint: divide the dot product by both lengths (torch.linalg.norm).")
    same = float(call(cosine, a, 10 * a))
    expect(abs(same - 1.0) < 1e-5, f"a vector and 10 times it point the same way: cosine 1, not {same:.4f}.")
    return "cosine similarity ignores length and compares direction only."


@exercise
def check_rope_frequencies(frequencies) -> str:
    """Exercise 2.3: frequencies(head_dim, theta) -> theta ** (-2i / head_dim) for i = 0 .. head_dim/2 - 1."""
    from ..rope import rope_frequencies

    expect(callable(frequencies), "define a function frequencies(head_dim, theta).")
    out = call(frequencies, 64, 100000.0)
    expect(isinstance(out, torch.Tensor), f"return a tensor, not {type(out).__name__}.")
    expect(tuple(out.shape) == (32,), f"64 numbers make 32 pairs, so 32 frequencies, not shape {tuple(out.shape)}.")
    ref = rope_frequencies(64, 100000.0)
    expect(abs(float(out[0]) - 1.0) < 1e-6, "the first pair turns 1 radian per position: theta ** 0 = 1.")
    expect(torch.allclose(out.float(), ref, rtol=1e-4),
           "the values differ from theta ** (-2i / head_dim). Hint: torch.arange(0, head_dim, 2) / head_dim.")
    return (f"pair 0 turns 1 radian per token, pair 31 only {float(ref[-1]):.1e}: "
            "fast pairs see nearby order, slow ones far.")
