"""Checks for notebook 02 (embeddings and positions): the one-hot lookup, cosine similarity, RoPE by hand.

Each check runs the learner's function on tables, vectors and positions the notebook never showed, compares it
with the library (embeddings.one_hot_lookup, rope.apply_rope) and names the typical mistake.
"""

from __future__ import annotations

import sys

import torch

from ..model import rope as rope_module
from . import NotYet, call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: notebook)


def _table(seed: int = 0, vocab: int = 11, hidden: int = 6) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed))  # a small [vocab, hidden] table


class _UnindexableTable(torch.Tensor):
    """An embedding table that refuses to be indexed, so that only the one-hot product can read it."""

    REFUSED = {torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select, torch.nn.functional.embedding,
               torch.embedding, torch.gather, torch.Tensor.gather, torch.take, torch.Tensor.take,
               torch.Tensor.index_select, torch.take_along_dim}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.REFUSED:
            raise NotYet("you read the rows by indexing the table (table[ids], index_select or F.embedding): that is "
                         "the lookup itself. Build one-hot rows and multiply them by the table.")
        return super().__torch_function__(func, types, args, kwargs or {})


@exercise
@hints("A one-hot row for id i is all zeros except a 1 at column i. What do you get when you multiply it by the table?",
       "torch.nn.functional.one_hot(ids, num_classes) makes the rows; num_classes is the vocabulary, table.shape[0]; "
       "convert them to the table's dtype before the product.",
       "one_hot = torch.nn.functional.one_hot(ids, table.shape[0]).to(table.dtype)  # [..., vocab]; "
       "return one_hot @ table  # [..., hidden]")
def check_one_hot_embed(embed) -> str:
    """Exercise 2.1: embed(ids, table) with a one-hot matrix product; indexing the table is refused."""
    expect(callable(embed), "define a function embed(ids, table) that returns one vector per id.")
    for table, ids in [(_table(), torch.tensor([3, 0, 7, 3])), (_table(1, 13, 5).double(), torch.tensor([[12, 1, 1],
                                                                                                         [0, 4, 9]]))]:
        guarded = table.clone().as_subclass(_UnindexableTable)
        out = returned(call(embed, ids.clone(), guarded), "tensor", "the embeddings").as_subclass(torch.Tensor)
        want = tuple(ids.shape) + (table.shape[1],)
        expect(tuple(out.shape) == want, f"for ids of shape {tuple(ids.shape)} and a {list(table.shape)} table the "
                                         f"result is {list(want)} (one row per id), not {list(out.shape)}: "
                                         "one_hot(ids, vocab) is [..., vocab], and [..., vocab] @ [vocab, hidden] is "
                                         "[..., hidden].")
        expect(torch.allclose(out.to(table.dtype), table[ids], atol=1e-6),
               "the vectors are not the table's rows: each one-hot row must hold a single 1, at the token's id.")
    return "a one-hot row times the table picks exactly that token's row: the lookup is a matrix product."


@exercise
@hints("Cosine similarity compares directions only: the length of each vector must not matter.",
       "It is the dot product divided by the product of the two lengths (torch.linalg.norm gives a length).",
       "return float(a @ b / (torch.linalg.norm(a) * torch.linalg.norm(b)))")
def check_cosine_similarity(cosine) -> str:
    """Exercise 2.2: cosine(a, b) = a.b / (|a| |b|), a float from -1 to 1."""
    expect(callable(cosine), "define a function cosine(a, b) that returns a number.")
    a, b = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([2.0, 0.0, 1.0])
    library = [(torch.nn.functional, "cosine_similarity"), (torch, "cosine_similarity")]
    with forbidden_all(library, "divide the dot product by both lengths yourself"):
        value = returned(call(cosine, a.clone(), b.clone()), "number", "the cosine (a single number)")
    expect(abs(value - 4 / (3 * 5 ** 0.5)) < 1e-5,
           f"cosine([1,2,2], [2,0,1]) should be 4 / (3 * sqrt(5)) = {4 / (3 * 5 ** 0.5):.4f}, not {value:.4f}: "
           "divide the dot product by both lengths.")
    with forbidden_all(library, "divide the dot product by both lengths yourself"):
        same = returned(call(cosine, a.clone(), 10 * a), "number", "the cosine (a single number)")
    expect(abs(same - 1.0) < 1e-5, f"a vector and 10 times it point the same way: cosine 1, not {same:.4f}.")
    with forbidden_all(library, "divide the dot product by both lengths yourself"):
        away = returned(call(cosine, torch.tensor([0.0, 3.0, -4.0]), torch.tensor([0.0, -6.0, 8.0])), "number",
                        "the cosine (a single number)")
    expect(abs(away + 1.0) < 1e-5,
           f"[0,3,-4] and [0,-6,8] point in opposite directions: cosine -1, not {away:.4f}"
           + (": the sign is the answer, do not take abs()." if abs(away - 1.0) < 1e-5 else "."))
    return "cosine similarity ignores length and compares direction only."


def _reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cos, sin = rope_module.rope_cos_sin(positions, x.shape[-1], theta, dtype=torch.float64)
    return rope_module.apply_rope(x.double()[None, None], cos, sin)[0, 0]


def _interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    angles = rope_module.rope_angles(positions, x.shape[-1], theta, torch.float64)  # [seq, d/2]
    even, odd = x.double()[:, 0::2], x.double()[:, 1::2]
    out = torch.empty_like(x, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = even * angles.cos() - odd * angles.sin(), even * angles.sin() + odd * angles.cos()
    return out


def _no_library_rope() -> forbidden_all:
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    names = ("apply_rope", "rotate_half", "rope_cos_sin", "rotate_2d", "rope_angles", "rope_frequencies")
    return forbidden_all([(rope_module, name) for name in names]
                         + [(llama, "apply_rotary_pos_emb"), (llama, "rotate_half")],
                         "turn each pair yourself: (x cos a - y sin a, x sin a + y cos a)")


@exercise
@hints("Cut x into pairs, turn each pair by an angle that grows with the position, and put the numbers back where "
       "they were. Which number is paired with which in Llama's layout?",
       "Pair j is (x[:, j], x[:, j + d/2]): the two halves of the vector. Pair j turns by position * theta ** (-2j / d) "
       "radians, counter-clockwise: (x cos a - y sin a, x sin a + y cos a).",
       "d = x.shape[-1]; freqs = 1 / theta ** (torch.arange(0, d, 2) / d); a = positions[:, None] * freqs  # [seq, d/2]; "
       "x1, x2 = x[:, :d//2], x[:, d//2:]; return torch.cat([x1*a.cos() - x2*a.sin(), x1*a.sin() + x2*a.cos()], -1)")
def check_rope(rope) -> str:
    """Exercise 2.3: rope(x, positions, theta) turns one head's vectors x [seq, head_dim] by their positions [seq]."""
    expect(callable(rope), "define a function rope(x, positions, theta) that returns a tensor shaped like x.")
    g = torch.Generator().manual_seed(3)
    cases = [(torch.randn(4, 8, generator=g), torch.tensor([0, 1, 2, 3]), 10000.0),
             (torch.randn(5, 16, generator=g), torch.tensor([5, 3, 100, 4096, 7]), 100000.0)]
    for x, positions, theta in cases:
        with _no_library_rope():
            out = returned(call(rope, x.clone(), positions.clone(), theta), "tensor", "the turned vectors")
        expect(tuple(out.shape) == tuple(x.shape), f"return a tensor shaped like x, {list(x.shape)}, not "
                                                   f"{list(out.shape)}.")
        out = out.double()
        right = _reference_rope(x, positions, theta)
        if torch.allclose(out, right, atol=2e-3):
            continue
        expect(torch.allclose(out.norm(dim=-1), x.double().norm(dim=-1), atol=1e-3),
               "the lengths changed: a rotation keeps each pair's length, so mix each pair with cos and sin of one "
               "angle, both numbers of the pair with the same angle.")
        expect(not torch.allclose(out, _interleaved(x, positions, theta), atol=2e-3),
               "you turned neighbours (x[2i], x[2i+1]); Llama's layout pairs x[j] with x[j + d/2], the two halves "
               "(the checkpoint's query and key rows are stored in that order).")
        expect(not torch.allclose(out, _reference_rope(x, -positions, theta), atol=2e-3),
               "you turned the pairs the wrong way round: (x cos a - y sin a, x sin a + y cos a) turns "
               "counter-clockwise.")
        expect(not torch.allclose(out, _reference_rope(x, torch.arange(len(positions)), theta), atol=2e-3),
               "use the positions you are given (here they are not 0, 1, 2 ...): the angle is position * frequency.")
        expect(False, f"not yet equal to RoPE for head_dim {x.shape[-1]}, theta {theta:,.0f}: pair j turns by "
                      "position * theta ** (-2j / head_dim) radians (pair 0 by 1 radian per position).")
    return "the same numbers as the library's apply_rope, which matches transformers: RoPE is just rotations."
