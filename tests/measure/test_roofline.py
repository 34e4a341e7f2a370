"""FLOP and byte accounting of a forward pass, the roofline's maths, and the ridge batch (known numbers)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import Peaks
from llm_anatomy.measure.roofline import (Work, forward_work, matmul_parameters, naive_score_bytes, roof,
                                          roofline_point)
from llm_anatomy.model.attention import attention
from llm_anatomy.model.scratch import ScratchConfig


def test_roofline_point_maths_on_known_numbers():
    work = Work(flops=2e9, bytes=1e9)
    assert work.intensity == 2.0
    point = roofline_point("decode b=1", work, seconds=0.5)
    assert point.intensity == 2.0 and point.flops_per_s == 4e9
    peaks = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")
    assert peaks.ridge_intensity == 10.0
    assert roof(peaks, 2.0) == 20e9  # below the ridge: bandwidth x intensity
    assert roof(peaks, 50.0) == 100e9  # above it: the compute peak
    with pytest.raises(CourseError):
        roofline_point("x", work, 0)
    with pytest.raises(CourseError):
        Work(1.0, 0.0).intensity


def test_forward_work_counts_weights_and_kv(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    norms = sum(p.numel() for n, p in tiny_model.named_parameters() if "norm" in n)
    # tied embeddings: the LM head's matmul reads the embedding table; every other weight is a projection
    assert matmul_parameters(cfg) == sum(p.numel() for p in tiny_model.parameters()) - norms
    w = matmul_parameters(cfg)
    decode = forward_work(cfg, new_tokens=1, past=9, batch=1, bytes_per_element=4)
    kv_per_position = 2 * 2 * 2 * 16 * 4  # K and V x layers x kv_heads x head_dim x fp32
    assert decode.bytes == w * 4 + kv_per_position * 10
    assert decode.flops == 2 * w + 4 * 2 * 4 * 16 * 10  # attention over 10 positions, 4 heads of 16
    prefill = forward_work(cfg, new_tokens=100, past=0, batch=1, bytes_per_element=4)
    assert prefill.intensity > 30 * decode.intensity  # the weights are read once for all 100 tokens
    batched = forward_work(cfg, new_tokens=1, past=9, batch=8, bytes_per_element=4)
    assert batched.intensity > 5 * decode.intensity


def test_the_lm_head_is_counted_only_where_it_runs(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    head = cfg.vocab_size * cfg.hidden_size
    last_only = forward_work(cfg, new_tokens=100, logits_tokens=1)  # generation: logits of the last position
    every = forward_work(cfg, new_tokens=100, logits_tokens=None)  # training or scoring: every position
    assert every.flops - last_only.flops == 2 * head * 99
    assert every.bytes == last_only.bytes  # the head's weights are read once either way
    batch = forward_work(cfg, new_tokens=10, batch=3)
    assert batch.flops - forward_work(cfg, new_tokens=10, batch=3, logits_tokens=None).flops == -2 * head * 3 * 9


def test_materialized_scores_add_their_traffic(tiny_model):
    cfg = ScratchConfig.from_hf(tiny_model.config)
    plain = forward_work(cfg, new_tokens=64, past=0)
    naive = forward_work(cfg, new_tokens=64, past=0, materialized_scores=True)
    scores = cfg.num_layers * cfg.num_heads * 64 * 64  # one [64, 64] score matrix per head and layer
    assert naive.bytes - plain.bytes == 32 * scores  # eight fp32 passes over every score
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 64
    assert naive.flops - plain.flops == attention_flops * (64 - 65 / 2)  # the full square against the causal half
    with pytest.raises(CourseError, match="new_tokens"):
        forward_work(cfg, new_tokens=0)




def test_ridge_batch_is_where_decode_crosses_the_ridge():
    from transformers import LlamaConfig

    from llm_anatomy.measure.roofline import ridge_batch
    from llm_anatomy.weights.random import RANDOM_SHAPES

    smol = ScratchConfig.from_hf(LlamaConfig(**RANDOM_SHAPES["135m"]))  # SmolLM2-135M's shape
    for ridge, size in ((6.0, 4), (150.0, 2), (25.0, 2)):
        b = ridge_batch(smol, 16, size, ridge)
        assert forward_work(smol, 1, 16, b, size).intensity >= ridge  # reached at b ...
        assert forward_work(smol, 1, 16, b - 1, size).intensity < ridge  # ... and not one sooner
    assert ridge_batch(smol, 100_000, 2, 500.0) is None  # a long context: the cache keeps every batch below it
    assert ridge_batch(smol, 16, 2, 500.0) > ridge_batch(smol, 16, 2, 50.0)  # a higher ridge needs a bigger batch


class _ScoreTraffic(TorchDispatchMode):
    """Bytes read and written by every op that touches a tensor of `scores` elements (views move nothing)."""

    def __init__(self, scores: int):
        super().__init__()
        self.scores, self.bytes = scores, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        is_view = func is torch.ops.aten._unsafe_view.default or any(r.alias_info for r in func._schema.returns)
        if not is_view:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors if t.numel() == self.scores)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len", [40, 1])
def test_naive_score_bytes_are_what_the_plain_attention_moves(dtype, q_len):
    """Count the bytes of every op of model/attention.py's attention that reads or writes the score matrix."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, q_len, 64, generator=g).to(dtype)  # [batch, heads, q_len, head_dim]
    k, v = (torch.randn(1, 3, 40, 64, generator=g).to(dtype) for _ in range(2))  # [batch, kv_heads, 40, head_dim]
    counter = _ScoreTraffic(9 * q_len * 40)
    with torch.no_grad(), counter:
        attention(q, k, v)
    per_score = counter.bytes / (9 * q_len * 40)
    assert per_score == naive_score_bytes(dtype.itemsize, masked=q_len > 1)
    assert per_score == (32 if q_len > 1 else {torch.float32: 24, torch.bfloat16: 28}[dtype])  # no mask at decode


PEAKS = Peaks("test", "float32", flops_per_s=100e9, bytes_per_s=10e9, how="")  # ridge 10 FLOP/byte


def test_c6_claims_compute_bound_only_when_the_run_reaches_its_share_of_the_roof():
    from llm_anatomy.claims import ClaimFailed
    from llm_anatomy.measure.roofline import claim_compute_bound, roof_share

    work = Work(flops=50e9, bytes=1e9)  # 50 FLOP/byte: right of the ridge, roof = 100 GFLOP/s
    assert roof_share(PEAKS, work, 1.0) == 0.5
    assert "C6 holds" in repr(claim_compute_bound(PEAKS, work, 1.0, 0.3, "prefill"))
    with pytest.raises(ClaimFailed, match=r"10% of the roof .*\(the compute roof"):
        claim_compute_bound(PEAKS, work, 5.0, 0.3, "prefill")  # the same work five times slower: broken evidence
    with pytest.raises(ClaimFailed, match="bandwidth slope"):  # left of the ridge the roof is the slope, 20 GFLOP/s
        claim_compute_bound(PEAKS, Work(flops=2e9, bytes=1e9), 1.0, 0.3, "decode")


def test_c11_claims_the_byte_model_as_a_floor():
    from llm_anatomy.claims import ClaimFailed
    from llm_anatomy.measure.roofline import claim_byte_floor

    assert "C11 holds" in repr(claim_byte_floor(PEAKS, 1e9, 0.25, "decode"))  # 0.1 s is the floor: 2.5x it
    assert "C11 holds" in repr(claim_byte_floor(PEAKS, 1e9, 0.095, "decode"))  # within the 0.9 allowance
    with pytest.raises(ClaimFailed, match="0.50x that"):
        claim_byte_floor(PEAKS, 1e9, 0.05, "decode")  # faster than its bytes allow: the count or the bandwidth is wrong
    with pytest.raises(ClaimFailed):
        claim_byte_floor(PEAKS, 2e9, 0.15, "decode")  # bytes undercounted by half would pass: counted right, it fails


def test_the_predicted_decode_step_is_the_larger_of_the_byte_and_the_flop_floors():
    from llm_anatomy.measure.roofline import predict_decode_step_s

    # 1 GB of weights, 1 kB of cache per token, 0.5 G parameters, 100 GB/s, 10 TFLOP/s
    memory_bound = predict_decode_step_s(4, 1000, 1e9, 1e3, 0.5e9, 100e9, 10e12)
    assert memory_bound == pytest.approx((1e9 + 4 * 1000 * 1e3) / 100e9)
    compute_bound = predict_decode_step_s(4096, 1, 1e9, 1e3, 0.5e9, 100e9, 10e12)
    assert compute_bound == pytest.approx(2 * 4096 * 0.5e9 / 10e12)
