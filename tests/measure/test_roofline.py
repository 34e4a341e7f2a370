"""FLOP and byte accounting of a forward pass, the roofline's maths, and the ridge batch (known numbers)."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.peaks import Peaks
from llm_anatomy.measure.roofline import Work, forward_work, matmul_parameters, roof, roofline_point
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
    scores = cfg.num_layers * cfg.num_heads * 64 * 64 * 4  # one fp32 [64, 64] score matrix per head and layer
    assert naive.bytes - plain.bytes == 3 * scores and naive.flops == plain.flops
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
