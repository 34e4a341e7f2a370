"""Checks for notebook 03 (attention)."""

from __future__ import annotations

import torch

from . import call, exercise, expect


@exercise
def check_causal_mask(mask) -> str:
    """Exercise 3.1: mask(n) -> a [n, n] bool tensor, True where query i may look at key j (j <= i)."""
    expect(callable(mask), "define a function mask(n) that returns an [n, n] tensor of True/False.")
    out = call(mask, 4)
    expect(isinstance(out, torch.Tensor), f"return a tensor, not {type(out).__name__}.")
    expect(tuple(out.shape) == (4, 4), f"mask(4) should be [4, 4], not {tuple(out.shape)}.")
    expect(out.dtype == torch.bool, "return True/False values (dtype torch.bool), for example with `<=` or .bool().")
    ref = torch.ones(4, 4, dtype=torch.bool).tril()
    expect(not torch.equal(out, ref.T), "that is the other triangle: row i is the query, and it may see keys j <= i.")
    expect(torch.equal(out, ref), "row i (the query) should be True for columns 0..i and False after. "
                                  "Hint: torch.ones(n, n, dtype=torch.bool).tril().")
    return "each token sees itself and the tokens before it, never the ones after."


@exercise
def check_one_head(attend) -> str:
    """Exercise 3.2: attend(q, k, v) for one head: q, k, v are [seq, head_dim]; causal; returns [seq, head_dim]."""
    from ..attention import attention

    expect(callable(attend), "define a function attend(q, k, v).")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 8, generator=g) for _ in range(3))
    out = call(attend, q, k, v)
    expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (5, 8),
           "return one output vector per query: a [seq, head_dim] tensor, here [5, 8].")
    ref = attention(q[None, None], k[None, None], v[None, None])[0, 0]
    unmasked = attention(q[None, None], k[None, None], v[None, None], causal=False)[0, 0]
    expect(not torch.allclose(out, unmasked, atol=1e-5), "apply the causal mask: set scores[i, j] = -inf where j > i.")
    unscaled = attention(q[None, None] * 8 ** 0.5, k[None, None], v[None, None])[0, 0]
    expect(not torch.allclose(out, unscaled, atol=1e-5), "divide the scores by sqrt(head_dim) before the softmax.")
    expect(torch.allclose(out, ref, atol=1e-5),
           "not yet equal to attention. Steps: scores = q @ k.T / sqrt(d); mask; softmax over the last dimension; @ v.")
    return "scores, mask, softmax, weighted sum: that is all of attention."


@exercise
def check_kv_head(answer) -> str:
    """Exercise 3.3: which KV head does query head 7 read in the default model (9 query heads, 3 KV heads)?"""
    expect(answer is not None, "assign a whole number to `answer`.")
    expect(isinstance(answer, int) and not isinstance(answer, bool), f"give a whole number, not {answer!r}.")
    expect(answer == 2, f"not {answer}. Hint: 9 / 3 = 3 query heads share each KV head, in order: "
                        "heads 0-2 read KV head 0, heads 3-5 read KV head 1, ...")
    return "query head 7 is in the third group of three, so it reads KV head 2 (7 // 3)."
