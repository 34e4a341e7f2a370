"""Checks for notebook 03 (attention): one causal head, grouped-query sharing of K/V heads, and GQA without the copy.

Each check runs the learner's function on shapes the notebook never showed, compares it with the library
(attention.attention, attention.repeat_kv) and names the typical mistake. The library's attention, torch's fused
kernel and repeat_kv are refused while the learner's code runs: writing them is the exercise.
"""

from __future__ import annotations

import math
import sys

import torch

from ..model import attention as attention_module
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from ._watch import aten_made, torch_calls


def _head(q, k, v, *, causal=True, scale="sqrt", fill=float("-inf"), dim=-1, diagonal=0, transposed=False,
          mask_after=None):
    """One causal head in float64, or what a typical mistake computes instead (one argument changed)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (k @ q.T if transposed else q @ k.T) / {"sqrt": math.sqrt(q.shape[-1]), "d": q.shape[-1], None: 1.0}[scale]
    hidden = ~torch.ones_like(scores, dtype=torch.bool).tril(diagonal)  # [seq, seq]: True above the diagonal
    if causal and mask_after is None:
        scores = scores.masked_fill(hidden, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask_after is not None:  # the mask applied to the weights, after the softmax
        weights = weights.masked_fill(hidden, mask_after)
    return weights @ v


_ONE_HEAD_MISTAKES = [  # (what the mistake computes, the message that names it)
    (dict(causal=False), "apply the causal mask: query i may see keys 0..i only, so set scores[i, j] = -inf where "
                         "j > i."),
    (dict(fill=0.0), "a masked score must be -inf, not 0: exp(0) = 1 still gives the future key a weight; "
                     "exp(-inf) = 0."),
    (dict(diagonal=1), "your mask is one off: it lets query i see key i + 1 too. Hide only j > i: "
                       "torch.ones(n, n, dtype=torch.bool).tril() keeps the diagonal and everything below it."),
    (dict(diagonal=-1), "your mask is one off: it hides the diagonal too, so query i cannot see itself (and query 0 "
                        "sees nothing at all: its row is NaN). Hide only j > i: .tril() keeps the diagonal."),
    (dict(mask_after=0.0), "mask the scores BEFORE the softmax: zeroing weights afterwards leaves rows that no "
                           "longer sum to 1 (each query's weights must add up to 1 over the keys it may see)."),
    (dict(mask_after=float("-inf")), "mask the scores BEFORE the softmax, with -inf: masking the weights afterwards "
                                     "puts -inf (or NaN) into the output."),
    (dict(scale=None), "divide the scores by sqrt(head_dim) before the softmax."),
    (dict(scale="d"), "you divided the scores by head_dim; divide by its square root, sqrt(head_dim): a dot product "
                      "of head_dim numbers has a spread that grows like sqrt(head_dim)."),
    (dict(transposed=True), "your scores are transposed: scores[i, j] is query i against key j, q @ k.T (not "
                            "k @ q.T), so that row i holds query i's scores."),
    (dict(dim=0), "take the softmax along each row (dim=-1): one query's weights over the keys sum to 1."),
]


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
    from torch.nn.attention import flex_attention  # imported here, so that it is refused even if imported later

    refused = [(torch.nn.functional, "scaled_dot_product_attention"), (attention_module, "attention"),
               (attention_module, "attention_probabilities"), (torch.nn.functional, "multi_head_attention_forward"),
               torch.nn.MultiheadAttention, (flex_attention, "flex_attention"),
               (type(torch.ops.higher_order.flex_attention), "__call__")]  # the op behind it
    for seq, d in [(5, 8), (7, 16)]:
        q, k, v = (2 * torch.randn(seq, d, generator=g) for _ in range(3))
        with forbidden_all(refused, "write the scores, the mask and the softmax yourself",
                           transformers=("eager_attention_forward",)):
            out = returned(call(attend, q.clone(), k.clone(), v.clone()), "tensor", "the head's output")
        expect(tuple(out.shape) == (seq, d), f"return one output vector per query: a [seq, head_dim] tensor, here "
                                             f"[{seq}, {d}], not {list(out.shape)}.")
        out = out.double()
        if torch.allclose(out, _head(q, k, v), atol=1e-5):
            continue
        for change, message in _ONE_HEAD_MISTAKES:
            expect(not torch.allclose(out, _head(q, k, v, **change), atol=1e-5, equal_nan=True), message)
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
       "[n_heads, seq, d]: a real copy, n_rep times the memory (exercise 3.3 needs no copy at all)")
def check_expand_kv(expand_kv) -> str:
    """Exercise 3.2: expand_kv(k, n_heads) gives each query head the K (or V) head its group shares: [n_heads, seq, d]."""
    expect(callable(expand_kv), "define a function expand_kv(k, n_heads).")
    g = torch.Generator().manual_seed(1)
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    refused = [(attention_module, "repeat_kv"), (attention_module, "kv_head_of"), (llama, "repeat_kv")]
    for heads, kv_heads in [(9, 3), (8, 2), (4, 1), (6, 6)]:
        k = torch.randn(kv_heads, 5, 4, generator=g)  # [kv_heads, seq, head_dim]
        with forbidden_all(refused, "share the heads yourself", transformers=("repeat_kv",)):
            out = returned(call(expand_kv, k.clone(), heads), "tensor", "the expanded K")
        expect(tuple(out.shape) == (heads, 5, 4),
               f"with {kv_heads} K/V heads and {heads} query heads, return [{heads}, seq, head_dim] (one K head per "
               f"query head), not {list(out.shape)}.")
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
    with forbidden_all(refused, "share the heads yourself"):
        k9, v9 = (returned(call(expand_kv, t[0].clone(), 9), "tensor", "the expanded K") for t in (k, v))
    expect(torch.allclose(attention_module.attention(q, k9[None], v9[None]), gqa, atol=1e-6),
           "with your expanded K and V, multi-head attention should equal grouped-query attention.")
    return ("each group of query heads reads one shared K/V head: the cache stores 3 heads, not 9, and the outputs "
            "are those of grouped-query attention.")


def _copies_of_k() -> forbidden_all:
    """The ways to copy K for every query head, refused: the exercise is to not make the copy."""
    return forbidden_all([attention_module.repeat_kv, (torch, "repeat_interleave"), (torch.Tensor, "repeat_interleave"),
                          (torch.Tensor, "repeat"), (torch.Tensor, "expand"), (torch.Tensor, "expand_as"),
                          (torch, "tile"), (torch.Tensor, "tile"), attention_module.attention_probabilities,
                          attention_module.attention],
                         "leave K as it is ([kv_heads, seq, head_dim]) and reshape the queries instead")


_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.bmm,
             torch.Tensor.bmm, torch.mm, torch.Tensor.mm, torch.einsum, torch.baddbmm, torch.Tensor.baddbmm,
             torch.nn.functional.linear, torch.tensordot, torch.inner, torch.Tensor.inner}


class _KOperands:
    """Watches every matrix product while the learner's code runs and keeps the largest operand shaped like K
    ([..., k_len, d] or [..., d, k_len]): K left with kv_heads as a batch dimension holds no more numbers than K;
    a K copied for every query head (indexing, cat, stack, index_select, broadcast_to then reshape) holds n_rep
    times as many."""

    def __init__(self, k_len: int, d: int):
        self.shapes, self.largest = {(k_len, d), (d, k_len)}, 0

    def __enter__(self):
        def seen(func, args, kwargs, out):
            if func in _PRODUCTS:
                operands = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
                for t in operands + list(kwargs.values()):
                    if isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[-2:]) in self.shapes:
                        self.largest = max(self.largest, t.numel())

        self._watch = torch_calls(seen)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        return self._watch.__exit__(*exc)


class _KCopies:
    """Watches every tensor torch allocates while the learner's code runs (whatever call made it: indexing, cat,
    stack, or torch.matmul broadcasting K over a group, which copies it inside) and keeps the largest that holds
    nothing but K's heads, more of them than K has: a K copied for every query head. A buffer filled in place later
    is looked at again at the end."""

    def __init__(self, k: torch.Tensor):
        self.k, self.largest, self.kept = k, 0, []

    def _copies_k(self, t: torch.Tensor) -> bool:
        kv, k_len, d = self.k.shape
        if not t.is_floating_point() or t.numel() <= self.k.numel() or t.numel() % (k_len * d):
            return False
        layouts = [t.reshape(-1, k_len, d)]  # [..., k_len, d], flattened or not
        if t.dim() >= 2 and t.shape[-2] == d:  # [..., d, k_len]: K transposed (k.mT), flattened or not
            layouts.append(t.transpose(-2, -1).reshape(-1, k_len, d))
        heads = self.k.to(t.dtype)
        return any(all(any(torch.equal(part, head) for head in heads) for part in layout) for layout in layouts)

    def _look(self, t: torch.Tensor) -> None:
        if self._copies_k(t):
            self.largest = max(self.largest, t.numel())

    def __enter__(self):
        def seen(t):
            if t.is_floating_point() and t.numel() > self.k.numel():
                self.kept.append(t)
                self._look(t)

        self._watch = aten_made(seen)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        self._watch.__exit__(*exc)
        for t in self.kept:  # what the buffers hold now
            self._look(t)
        self.kept = []
        return False


def _grouped_reference(q: torch.Tensor, k: torch.Tensor, grouping: str = "h // n_rep", scale=True) -> torch.Tensor:
    heads, kv = q.shape[0], k.shape[0]
    n_rep = heads // kv
    of = [h // n_rep for h in range(heads)] if grouping == "h // n_rep" else [h % kv for h in range(heads)]
    scores = q.double() @ k.double()[of].transpose(-2, -1)  # [heads, q_len, k_len]
    return scores / math.sqrt(q.shape[-1]) if scale else scores


@exercise
@hints("Query heads g * n_rep ... g * n_rep + n_rep - 1 all read K/V head g. Instead of copying K/V head g n_rep "
       "times, what if the n_rep query heads of a group were stacked into one taller matrix?",
       "q is [heads, q_len, d] with the heads in order, so q.reshape(kv_heads, n_rep * q_len, d) puts each group's "
       "query rows together; one batched matmul with k.transpose(-2, -1) scores them all against their shared K.",
       "Divide by sqrt(head_dim), then view the [kv_heads, n_rep * q_len, k_len] result back as [heads, q_len, "
       "k_len]: the rows come out head by head, in order.")
def check_grouped_scores(grouped_scores) -> str:
    """Exercise 3.3: grouped_scores(q, k) -> q k^T / sqrt(d) per query head, [heads, q_len, k_len], K never copied."""
    expect(callable(grouped_scores), "define a function grouped_scores(q, k) that returns the scores of every query "
                                     "head.")
    g = torch.Generator().manual_seed(33)
    for heads, kv, q_len, k_len, d in [(6, 2, 3, 5, 8), (8, 4, 1, 7, 16), (4, 1, 3, 6, 4)]:  # K's shape is its own
        q = torch.randn(heads, q_len, d, generator=g)
        k = torch.randn(kv, k_len, d, generator=g)
        given = k.clone()
        with _copies_of_k(), _KOperands(k_len, d) as products, _KCopies(given) as copies:
            out = call(grouped_scores, q.clone(), given)
        out = returned(out, "tensor", "the scores")
        expect(products.largest <= k.numel(), f"your matrix product read a K of {products.largest} numbers, "
                                              f"{products.largest // k.numel()}x the {k.numel()} of the K you were "
                                              f"given: K was copied for every query head (indexing with arange // "
                                              "n_rep, cat, stack, index_select and broadcast_to(...).reshape all copy). "
                                              "Leave K as [kv_heads, k_len, d] and reshape the queries instead.")
        expect(copies.largest == 0, f"your code made a copy of K holding {copies.largest} numbers, "
                                    f"{copies.largest // k.numel()}x the {k.numel()} of the K you were given: K was "
                                    "copied for every query head (by indexing, cat, stack, or a torch.matmul that "
                                    "broadcasts K over a group, which copies it inside). Leave K as [kv_heads, k_len, "
                                    "d] and reshape the queries to [kv_heads, n_rep * q_len, d] instead.")
        expect(tuple(out.shape) == (heads, q_len, k_len), f"for {heads} query heads, {q_len} queries and {k_len} keys "
                                                          f"return [{heads}, {q_len}, {k_len}], not {list(out.shape)}.")
        out = out.double()
        if torch.allclose(out, _grouped_reference(q, k), atol=1e-5):
            continue
        expect(kv == 1 or not torch.allclose(out, _grouped_reference(q, k, "h % kv"), atol=1e-5),
               "query head h reads K/V head h // n_rep (heads 0, 1, 2 share K/V head 0 when n_rep is 3), not h % "
               "kv_heads: reshape q to [kv_heads, n_rep * q_len, d], groups first.")
        expect(not torch.allclose(out, _grouped_reference(q, k, scale=False), atol=1e-5),
               "divide the scores by sqrt(head_dim), as in one head.")
        expect(False, f"not yet the scores of every query head against its group's K ({heads} heads over {kv} K/V heads, "
                      f"{q_len} queries): stack each group's queries, one matmul per group, then view back.")
    return "the same scores as copying K for every head, with no copy: what the library's attention does, and why."
