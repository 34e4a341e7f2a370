"""Notebook 03's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

import math

import torch

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.model import attention as attention_module
from llm_anatomy.exercises import ch03

solutions = load_solutions("ch03")


def test_solutions_pass():
    for verdict in (ch03.check_one_head(solutions.attend), ch03.check_expand_kv(solutions.expand_kv)):
        assert verdict.passed, verdict.message


def _masked(q, k, fill=float("-inf")):
    scores = q @ k.T / math.sqrt(q.shape[-1])
    return scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), fill)


def test_one_head_mistakes_get_specific_messages():
    no_mask = lambda q, k, v: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v  # noqa: E731
    not_yet(ch03.check_one_head(no_mask), "causal mask")
    zero_fill = lambda q, k, v: torch.softmax(_masked(q, k, 0.0), -1) @ v  # noqa: E731
    not_yet(ch03.check_one_head(zero_fill), "-inf, not 0")
    unscaled = lambda q, k, v: torch.softmax(_masked(q * q.shape[-1] ** 0.5, k), -1) @ v  # noqa: E731
    not_yet(ch03.check_one_head(unscaled), "sqrt(head_dim)")
    columns = lambda q, k, v: torch.softmax(_masked(q, k), 0) @ v  # noqa: E731
    not_yet(ch03.check_one_head(columns), "along each row")
    not_yet(ch03.check_one_head(lambda q, k, v: q), "not yet equal")
    not_yet(ch03.check_one_head(lambda q, k, v: q[0]), "[seq, head_dim]")
    not_yet(ch03.check_one_head(unattempted), "not attempted")


def test_one_head_refuses_the_fused_kernel_and_the_library():
    fused = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    not_yet(ch03.check_one_head(fused), "don't call", "scaled_dot_product_attention")
    library = lambda q, k, v: attention_module.attention(q[None, None], k[None, None], v[None, None])[0, 0]  # noqa: E731
    not_yet(ch03.check_one_head(library), "don't call")
    assert torch.nn.functional.scaled_dot_product_attention(*(torch.ones(1, 1, 2, 2),) * 3).shape == (1, 1, 2, 2)


def test_expand_kv_mistakes_get_specific_messages():
    not_yet(ch03.check_expand_kv(lambda k, n: k.repeat(n // k.shape[0], 1, 1)), "tiled", "repeat_interleave")
    not_yet(ch03.check_expand_kv(lambda k, n: k), "[9, seq, head_dim]")
    not_yet(ch03.check_expand_kv(lambda k, n: k.repeat_interleave(n // k.shape[0], 0).flip(0)), "h // 3")
    not_yet(ch03.check_expand_kv(lambda k, n: attention_module.repeat_kv(k[None], n // k.shape[0])[0]), "don't call")
    not_yet(ch03.check_expand_kv(unattempted), "not attempted")


def test_grouped_scores_solution_passes_and_equals_the_copy():
    assert ch03.check_grouped_scores(solutions.grouped_scores).passed
    q, k = torch.randn(9, 4, 8), torch.randn(3, 4, 8)
    from llm_anatomy.model.attention import repeat_kv

    copied = (q @ repeat_kv(k[None], 3)[0].transpose(-2, -1)) / 8 ** 0.5
    assert torch.allclose(solutions.grouped_scores(q, k), copied, atol=1e-5)


def test_grouped_scores_mistakes_and_copies_are_named():
    import math

    def modulo(q, k):  # heads dealt out h % kv
        kv = k.shape[0]
        stacked = q.reshape(q.shape[0] // kv, kv, *q.shape[1:]).transpose(0, 1).reshape(kv, -1, q.shape[-1])
        scores = stacked @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return scores.reshape(kv, q.shape[0] // kv, q.shape[1], -1).transpose(0, 1).reshape(q.shape[0], q.shape[1], -1)

    def unscaled(q, k):
        return solutions.grouped_scores(q, k) * math.sqrt(q.shape[-1])

    def copied(q, k):
        return q @ k.repeat_interleave(q.shape[0] // k.shape[0], dim=0).transpose(-2, -1) / math.sqrt(q.shape[-1])

    def expanded(q, k):
        n = q.shape[0] // k.shape[0]
        wide = k[:, None].expand(k.shape[0], n, *k.shape[1:]).reshape(q.shape[0], *k.shape[1:])
        return q @ wide.transpose(-2, -1) / math.sqrt(q.shape[-1])

    not_yet(ch03.check_grouped_scores(modulo), "h // n_rep")
    not_yet(ch03.check_grouped_scores(unscaled), "sqrt(head_dim)")
    not_yet(ch03.check_grouped_scores(copied), "don't call", "reshape the queries")
    not_yet(ch03.check_grouped_scores(expanded), "don't call")
    not_yet(ch03.check_grouped_scores(lambda q, k: solutions.grouped_scores(q, k)[:, -1]), "return [")
    not_yet(ch03.check_grouped_scores(unattempted), "not attempted")
    not_yet(ch03.check_grouped_scores(None), "define a function")
