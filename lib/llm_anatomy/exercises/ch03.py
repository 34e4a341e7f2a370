"""Checks for notebook 03 (attention): one causal head, and grouped-query sharing of K/V heads.

Each check runs the learner's function on shapes the notebook never showed, compares it with the library
(attention.attention, attention.repeat_kv) and names the typical mistake. The library's attention, torch's fused
kernel and repeat_kv are refused while the learner's code runs: writing them is the exercise.
"""

from __future__ import annotations

import contextlib
import math
import sys

import torch

from ..model import attention as attention_module
from . import call, exercise, expect, forbidden, hint, hints  # noqa: F401  (hint: for the notebook)


@contextlib.contextmanager
def _refused(pairs, why):
    with contextlib.ExitStack() as stack:
        for owner, name in pairs:
            if owner is not None:
                stack.enter_context(forbidden(owner, name, why))
        yield


def _head(q, k, v, *, causal=True, scale=True, fill=float("-inf"), dim=-1):
    scores = q.double() @ k.double().T / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), fill)
    return torch.softmax(scores, dim=dim) @ v.double()


@exercise
@hints("Each query is compared with every key; the comparison scores become weights; the weights mix the values. "
       "Which keys may query i see?",
       "scores = q @ k.T / sqrt(head_dim) is [seq, seq] (row = query, column = key); set the scores above the "
       "diagonal to -inf (exp(-inf) = 0), softmax each row, then multiply by v.",
       "scores = q @ k.T / math.sqrt(q.shape[-1]); allowed = torch.ones(n, n, dtype=torch.bool).tril(); "
       "scores = scores.masked_fill(~allowed, float('-inf')); return torch.softmax(scores, dim=-1) @ v")
def check_one_head(attend) -> str:
    """Exercise 3.1: attend(q, k, v) for one causal head: q, k, v are [seq, head_dim]; returns [seq, head_dim]."""
    expect(callable(attend), "define a function attend(q, k, v).")
    g = torch.Generator().manual_seed(0)
    why = "write the scores, the mask and the softmax yourself"
    refused = [(torch.nn.functional, "scaled_dot_product_attention"), (attention_module, "attention"),
               (attention_module, "attention_probabilities")]
    for seq, d in [(5, 8), (7, 16)]:
        q, k, v = (2 * torch.randn(seq, d, generator=g) for _ in range(3))
        with _refused(refused, why):
            out = call(attend, q.clone(), k.clone(), v.clone())
        expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (seq, d),
               f"return one output vector per query: a [seq, head_dim] tensor, here [{seq}, {d}].")
        out = out.double()
        if torch.allclose(out, _head(q, k, v), atol=1e-5):
            continue
        expect(not torch.allclose(out, _head(q, k, v, causal=False), atol=1e-5),
               "apply the causal mask: query i may see keys 0..i only, so set scores[i, j] = -inf where j > i.")
        expect(not torch.allclose(out, _head(q, k, v, fill=0.0), atol=1e-5),
               "a masked score must be -inf, not 0: exp(0) = 1 still gives the future key a weight; exp(-inf) = 0.")
        expect(not torch.allclose(out, _head(q, k, v, scale=False), atol=1e-5),
               "divide the scores by sqrt(head_dim) before the softmax.")
        expect(not torch.allclose(out, _head(q, k, v, dim=0), atol=1e-5),
               "take the softmax along each row (dim=-1): one query's weights over the keys sum to 1.")
        expect(False, "not yet equal to attention. Steps: scores = q @ k.T / sqrt(d); mask; softmax over the last "
                      "dimension; @ v.")
    return "scores, mask, softmax, weighted sum: that is all of attention, and it equals the library's on new inputs."


def _library_repeat(k: torch.Tensor, heads: int) -> torch.Tensor:
    return attention_module.repeat_kv(k[None], heads // k.shape[0])[0]


@exercise
@hints("Nine query heads, three K/V heads: each K/V head serves a group of query heads. In which order are the groups?",
       "Query heads are grouped in order: with 9 over 3, heads 0-2 read KV head 0, heads 3-5 read KV head 1, ... So KV "
       "head g must appear n_heads // kv_heads times in a row: repeat each head, do not tile the whole stack.",
       "n_rep = n_heads // k.shape[0]; return k.repeat_interleave(n_rep, dim=0)  # [kv_heads, seq, d] -> "
       "[n_heads, seq, d]; or index it: k[torch.arange(n_heads) // n_rep]")
def check_expand_kv(expand_kv) -> str:
    """Exercise 3.2: expand_kv(k, n_heads) gives each query head the K (or V) head its group shares: [n_heads, seq, d]."""
    expect(callable(expand_kv), "define a function expand_kv(k, n_heads).")
    g = torch.Generator().manual_seed(1)
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    refused = [(attention_module, "repeat_kv"), (attention_module, "kv_head_of"), (llama, "repeat_kv")]
    for heads, kv_heads in [(9, 3), (8, 2), (4, 1), (6, 6)]:
        k = torch.randn(kv_heads, 5, 4, generator=g)  # [kv_heads, seq, head_dim]
        with _refused(refused, "share the heads yourself"):
            out = call(expand_kv, k.clone(), heads)
        expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (heads, 5, 4),
               f"with {kv_heads} K/V heads and {heads} query heads, return [{heads}, seq, head_dim] (one K head per "
               f"query head), not {list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}.")
        right = _library_repeat(k, heads)
        if torch.equal(out, right):
            continue
        expect(not torch.equal(out, k.repeat(heads // kv_heads, 1, 1)),
               f"you tiled the stack ({', '.join(str(h % kv_heads) for h in range(min(heads, 6)))} ...). Query heads "
               "are grouped in order: heads 0-2 read KV head 0, heads 3-5 read KV head 1. Use repeat_interleave.")
        expect(False, f"query head h should read KV head h // {heads // kv_heads} (for {heads} heads over "
                      f"{kv_heads}); yours differ.")
    # the shared heads give the library's grouped-query attention
    q, k, v = torch.randn(1, 9, 6, 8, generator=g), torch.randn(1, 3, 6, 8, generator=g), torch.randn(1, 3, 6, 8, generator=g)
    gqa = attention_module.attention(q, k, v)
    with _refused(refused, "share the heads yourself"):
        k9, v9 = call(expand_kv, k[0], 9), call(expand_kv, v[0], 9)
    expect(torch.allclose(attention_module.attention(q, k9[None], v9[None]), gqa, atol=1e-6),
           "with your expanded K and V, multi-head attention should equal grouped-query attention.")
    return ("each group of query heads reads one shared K/V head: the cache stores 3 heads, not 9, and the outputs "
            "are those of grouped-query attention.")
