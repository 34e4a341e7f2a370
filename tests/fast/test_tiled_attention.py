"""Tiled attention with an online softmax (tiled_attention.py) against the plain attention and PyTorch's SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llm_anatomy.model.attention import attention
from llm_anatomy.errors import CourseError
from llm_anatomy.measure.memory import peak_tensor_bytes
from llm_anatomy.fast.tiled_attention import attention_bytes, online_softmax, online_softmax_update, tiled_attention


def _qkv(b, heads, kv_heads, q_len, k_len, d=16, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, q_len, d, generator=g) * scale
    k = torch.randn(b, kv_heads, k_len, d, generator=g) * scale
    v = torch.randn(b, kv_heads, k_len, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def test_online_softmax_equals_softmax_for_any_block():
    x = torch.randn(3, 101) * 10
    for block in (1, 7, 32, 101, 500):
        assert (online_softmax(x, block) - torch.softmax(x, dim=-1)).abs().max() < 1e-6


def test_one_update_rescales_what_was_summed():
    """Two blocks folded one by one give softmax(all scores) @ V, even when the second holds the maximum."""
    scores, v = torch.tensor([[1.0, 2.0, 9.0, 0.5]]), torch.randn(4, 3)
    m, l, o = torch.full((1, 1), float("-inf")), torch.zeros(1, 1), torch.zeros(1, 3)
    m, l, o = online_softmax_update(m, l, o, scores[:, :2], v[:2])
    assert m.item() == 2.0 and math.isclose(l.item(), 1 + math.exp(-1), rel_tol=1e-6)
    m, l, o = online_softmax_update(m, l, o, scores[:, 2:], v[2:])
    assert m.item() == 9.0
    assert (o / l - torch.softmax(scores, -1) @ v).abs().max() < 1e-6


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (1, 70), (37, 37), (130, 130), (5, 64)])
@pytest.mark.parametrize("causal", [True, False])
def test_tiled_equals_plain_attention_within_1e_6(heads, kv_heads, q_len, k_len, causal):
    q, k, v = _qkv(2, heads, kv_heads, q_len, k_len)
    plain = attention(q, k, v, causal=causal)
    for block_q, block_k in [(16, 16), (7, 33), (128, 5), (1000, 1000)]:  # tiles that do not divide the length too
        tiled = tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
        assert tiled.shape == plain.shape and (tiled - plain).abs().max() < 1e-6


def test_large_scores_are_rounded_no_worse_than_the_plain_way():
    """Scores up to about 50: both ways round; tiled is as close to the exact (float64) result as plain is."""
    q, k, v = _qkv(1, 6, 2, 130, 130, scale=3.0)
    exact = attention(q.double(), k.double(), v.double())
    plain_error = (attention(q, k, v) - exact).abs().max()
    tiled_error = (tiled_attention(q, k, v, block_q=16, block_k=16) - exact).abs().max()
    assert tiled_error < 2 * plain_error + 1e-7


def test_tiled_equals_sdpa():
    q, k, v = _qkv(1, 6, 2, 200, 200)
    sdpa = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True)
    assert (tiled_attention(q, k, v, block_q=64, block_k=48) - sdpa).abs().max() < 1e-5


def test_padding_keys_and_a_query_that_sees_none():
    q, k, v = _qkv(2, 4, 2, 9, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :4] = False  # left padding of the first sequence
    plain = attention(q, k, v, key_mask=mask)  # query 0..3 of sequence 0 see no key: zeros
    tiled = tiled_attention(q, k, v, key_mask=mask, block_q=4, block_k=2)
    assert (tiled - plain).abs().max() < 1e-6 and torch.isfinite(tiled).all()
    assert tiled[0, :, :4].abs().max() == 0


def test_half_precision_sums_in_fp32():
    q, k, v = _qkv(1, 4, 2, 64, 64, dtype=torch.bfloat16)
    reference = attention(q.float(), k.float(), v.float())
    tiled = tiled_attention(q, k, v, block_q=16, block_k=16)
    assert tiled.dtype == torch.bfloat16 and (tiled.float() - reference).abs().max() < 2e-2


def test_bad_input_is_refused_clearly():
    q, k, v = _qkv(1, 4, 2, 8, 8)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(CourseError, match="block_k"):
            tiled_attention(q, k, v, block_k=bad)
    with pytest.raises(CourseError, match="block_q"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(CourseError, match="more queries"):
        tiled_attention(*_qkv(1, 4, 2, 9, 8))
    with pytest.raises(CourseError, match="shared evenly"):
        tiled_attention(*_qkv(1, 5, 2, 8, 8))
    with pytest.raises(CourseError, match="weights"):
        tiled_attention(q, k, v, return_weights=True)
    with pytest.raises(CourseError, match="key_mask"):
        tiled_attention(q, k, v, key_mask=torch.ones(1, 7, dtype=torch.bool))
    with pytest.raises(CourseError, match="block"):
        online_softmax(torch.ones(4), 0)


def test_bytes_by_count():
    # plain: Q and output, K and V once, three passes over the fp32 scores
    assert attention_bytes(4, 4, 2, 1, 8, 4) == 2 * 2 * 4 * 8 * 4 + 2 * 1 * 8 * 4 * 4 + 3 * 4 * 2 * 4 * 4
    # tiled, causal: query tile 0 (positions 0-1) reads keys 0-1, tile 1 reads keys 0-3
    assert attention_bytes(4, 4, 2, 1, 8, 4, tiled=True, block_q=2) == 2 * 2 * 4 * 8 * 4 + 2 * 8 * 4 * (2 + 4)
    n = 4096
    assert attention_bytes(n, n, 9, 3, 64) > 20 * attention_bytes(n, n, 9, 3, 64, tiled=True, block_q=256)


def test_our_tiles_write_their_scores_to_memory():
    from llm_anatomy.fast.tiled_attention import tiled_score_bytes
    from llm_anatomy.measure.roofline import naive_score_bytes

    # no mask: every tile visited, 32 bytes per score (q.k writes, amax reads, shift and exp read and write, sum and
    # p @ v read)
    assert tiled_score_bytes(8, 8, 2, block_q=4, block_k=4, causal=False) == 2 * 8 * 8 * 32
    # tiles of one score never cross the diagonal: the causal half, 32 bytes each; no more than the plain attention
    assert tiled_score_bytes(8, 8, 2, block_q=1, block_k=1) == 2 * (8 * 9 // 2) * 32
    assert naive_score_bytes(4) == 32
    # one tile over everything: the whole square, masked (8 bytes more a score)
    assert tiled_score_bytes(8, 8, 2, block_q=8, block_k=8) == 2 * 64 * 40
    # a long prefill: about half the plain attention's score bytes, far from the fused kernel's none
    n, plain_scores = 4096, 9 * 4096 * 4096 * naive_score_bytes(4)
    assert 0.45 * plain_scores < tiled_score_bytes(n, n, 9) < 0.6 * plain_scores
    with pytest.raises(CourseError, match="block"):
        tiled_score_bytes(8, 8, 2, block_k=0)


def test_peak_memory_grows_with_the_square_for_plain_and_linearly_for_tiled():
    sizes, plain, tiled = (256, 512), [], []
    for n in sizes:
        q, k, v = _qkv(1, 4, 2, n, n, d=32)
        plain.append(peak_tensor_bytes(lambda: attention(q, k, v)))
        tiled.append(peak_tensor_bytes(lambda: tiled_attention(q, k, v, block_q=64, block_k=64)))
    scores = 4 * 4 * sizes[1] ** 2  # one fp32 score matrix of 4 heads at 512 tokens
    assert plain[1] >= scores and plain[1] / plain[0] > 3  # about 4x for twice the length
    assert tiled[1] < scores / 4 and tiled[1] / tiled[0] < 2.5  # about 2x: the output itself


def test_peak_memory_counts_what_a_function_allocates():
    assert peak_tensor_bytes(lambda: torch.zeros(1000, 250)) == 1_000_000
    kept = torch.zeros(1000)  # alive before: not counted
    assert peak_tensor_bytes(lambda: kept.add_(1)) < 100  # at most a scalar or two of bookkeeping


# --------------------------------------------------------------------------- C19's checks in false worlds


def _relative(attend):
    from llm_anatomy.fast.tiled_attention import relative_error

    q, k, v = _qkv(1, 6, 2, 200, 200, d=32, seed=4)
    plain = attention(q, k, v)
    return {(bq, bk): relative_error(attend(q, k, v, block_q=bq, block_k=bk), plain)
            for bq, bk in [(64, 64), (48, 100), (1, 256)]}


def test_the_equality_check_holds_for_tiled_attention():
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.tiled_attention import equality_evidence

    claim("C19", *equality_evidence(_relative(tiled_attention)))


@pytest.mark.counterfactual("C19", "an online softmax that does not rescale what it summed when the maximum grows")
def test_the_equality_check_fails_without_the_rescale(monkeypatch):
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast import tiled_attention as tiled

    def no_rescale(m, l, o, scores, v):
        m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
        e = torch.exp(scores - m_new)
        return m_new, l + e.sum(dim=-1, keepdim=True), o + e @ v  # the old l and o stay measured against the old m
    monkeypatch.setattr(tiled, "online_softmax_update", no_rescale)
    with pytest.raises(ClaimFailed, match="C19 FAILED"):
        claim("C19", *tiled.equality_evidence(_relative(tiled.tiled_attention)))


LENGTHS = [128, 256, 512, 1024]
HELD = (4 * 32 + 2 * 2 * 32) * 4  # bytes a token's output (4 heads) and keys and values (2 KV heads) take, d = 32, fp32


def _peaks(tiled_fn):
    plain, tiled = [], []
    for n in LENGTHS:
        q, k, v = _qkv(1, 4, 2, n, n, d=32, seed=n)
        plain.append(peak_tensor_bytes(lambda: attention(q, k, v)))
        tiled.append(peak_tensor_bytes(lambda: tiled_fn(q, k, v, block_q=64, block_k=64)))
    return plain, tiled


def test_the_memory_check_holds_for_tiled_attention():
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.tiled_attention import memory_growth_evidence

    claim("C19", *memory_growth_evidence(LENGTHS, *_peaks(tiled_attention), held_per_token=HELD))


@pytest.mark.counterfactual("C19", "a 'tiled' attention that materializes the whole score matrix")
def test_the_memory_check_fails_for_a_tiling_that_materializes_the_scores():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.tiled_attention import memory_growth_evidence

    def whole_matrix(q, k, v, *, block_q=128, block_k=128):  # computes every score at once, then returns in tiles
        return attention(q, k, v)
    with pytest.raises(ClaimFailed, match="C19 FAILED"):
        claim("C19", *memory_growth_evidence(LENGTHS, *_peaks(whole_matrix), held_per_token=HELD))


@pytest.mark.counterfactual("C19", "a tiled attention whose tile of queries spans the whole prompt (block_q = n)")
def test_the_memory_check_fails_when_a_tile_spans_the_prompt():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.tiled_attention import memory_growth_evidence

    def one_tile(q, k, v, *, block_q=128, block_k=128):  # a tile as large as the prompt: scores [n, n] at once
        return tiled_attention(q, k, v, block_q=q.shape[2], block_k=k.shape[2])
    with pytest.raises(ClaimFailed, match="C19 FAILED"):
        claim("C19", *memory_growth_evidence(LENGTHS, *_peaks(one_tile), held_per_token=HELD))


@pytest.mark.counterfactual("C19", "a 'tiled' attention that ignores block_k: each tile of queries scores every key")
def test_the_memory_check_fails_when_the_keys_are_not_tiled():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.tiled_attention import memory_growth_evidence

    def keys_whole(q, k, v, *, block_q=128, block_k=128):  # linear in n too, but a slab of [block_q, n] scores a tile
        return tiled_attention(q, k, v, block_q=block_q, block_k=k.shape[2])
    plain, tiled = _peaks(keys_whole)
    with pytest.raises(ClaimFailed, match="C19 FAILED.*bar 2x"):
        claim("C19", *memory_growth_evidence(LENGTHS, plain, tiled, held_per_token=HELD))
