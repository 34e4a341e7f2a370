"""Our rotary position embeddings equal transformers', and q.k depends only on the offset (C3)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from llm_anatomy import CourseError
from llm_anatomy.model.rope import (apply_rope, rope_angles, rope_cos_sin, rope_frequencies,
                              rotate_2d, rotate_half)

from llm_anatomy.weights.random import random_llama


def test_frequencies_are_theta_to_the_minus_2i_over_d():
    freqs = rope_frequencies(8, 10000.0)
    expected = torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)])
    assert torch.allclose(freqs, expected, rtol=1e-6)
    assert freqs[0] == 1.0 and freqs.shape == (4,)


def test_angles_grow_linearly_with_position():
    angles = rope_angles(torch.arange(5), 8, 10000.0)  # [5, 4]
    assert angles.shape == (5, 4)
    assert torch.allclose(angles[3], 3 * angles[1])
    assert torch.equal(angles[0], torch.zeros(4))


def test_odd_head_dim_is_refused():
    with pytest.raises(CourseError, match="even"):
        rope_frequencies(63, 10000.0)
    with pytest.raises(CourseError, match="even"):
        rotate_half(torch.zeros(2, 3))


def test_mismatched_cos_is_refused():
    cos, sin = rope_cos_sin(torch.arange(4), 8, 100.0)
    with pytest.raises(CourseError, match="agree"):
        apply_rope(torch.zeros(1, 2, 5, 8), cos, sin)


@pytest.mark.parametrize("head_dim, theta", [(16, 100000.0), (64, 10000.0), (32, 500000.0)])
def test_cos_sin_equal_the_transformers_rotary_embedding(head_dim, theta):
    model = random_llama(head_dim=head_dim, rope_theta=theta)
    positions = torch.arange(256)[None]
    x = torch.zeros(1, 256, head_dim)
    cos_ref, sin_ref = model.model.rotary_emb(x, positions)
    cos, sin = rope_cos_sin(positions, head_dim, theta)
    assert torch.equal(rope_frequencies(head_dim, theta), model.model.rotary_emb.inv_freq)
    assert (cos - cos_ref).abs().max() <= 1e-6 and (sin - sin_ref).abs().max() <= 1e-6


def test_apply_rope_equals_apply_rotary_pos_emb():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 10, 16), torch.randn(2, 2, 10, 16)
    positions = torch.tensor([list(range(10)), list(range(5, 15))])  # two different position runs
    cos, sin = rope_cos_sin(positions, 16, 100000.0)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(apply_rope(q, cos, sin), q_ref, atol=1e-6)
    assert torch.allclose(apply_rope(k, cos, sin), k_ref, atol=1e-6)


def test_the_real_models_rope(real):
    positions = torch.arange(512)[None]
    cos_ref, sin_ref = real.model.model.rotary_emb(torch.zeros(1, 512, 64), positions)
    from llm_anatomy.model.scratch import as_scratch

    cos, sin = as_scratch(real).rope(positions)  # the model's own path: frequencies made once, kept on its device
    assert cos.shape == (1, 512, 64)
    assert (cos - cos_ref).abs().max() <= 1e-6 and (sin - sin_ref).abs().max() <= 1e-6
    torch.manual_seed(1)
    q, k = torch.randn(1, 9, 512, 64), torch.randn(1, 3, 512, 64)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
    assert (apply_rope(q, cos, sin) - q_ref).abs().max() <= 1e-5
    assert (apply_rope(k, cos, sin) - k_ref).abs().max() <= 1e-5


def test_rotation_keeps_length_and_turns_each_pair():
    torch.manual_seed(2)
    x = torch.randn(1, 1, 3, 2)  # head_dim 2: a single pair, which RoPE turns by position * 1 radian
    cos, sin = rope_cos_sin(torch.arange(3), 2, 10000.0)
    rotated = apply_rope(x, cos, sin)
    for pos in range(3):
        assert torch.allclose(rotated[0, 0, pos], rotate_2d(x[0, 0, pos], float(pos)), atol=1e-6)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-6)
    assert torch.allclose(rotate_2d(torch.tensor([1.0, 0.0]), math.pi / 2), torch.tensor([0.0, 1.0]), atol=1e-7)


@pytest.mark.parametrize("offset", [0, 1, 7, 100])
def test_scores_depend_only_on_the_offset(offset):
    """q at position m and k at position n: rotated q.k is the same for every (m, n) with m - n = offset."""
    torch.manual_seed(3)
    q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    scores = []
    for n in [0, 5, 50, 300]:
        positions = torch.tensor([n + offset, n])
        cos, sin = rope_cos_sin(positions, 64, 100000.0, dtype=torch.float64)
        both = torch.stack([q, k])[None, None]  # [1, 1, 2, 64]
        rotated_q = apply_rope(both, cos, sin)[0, 0, 0]
        rotated_k = apply_rope(torch.stack([k, k])[None, None], cos, sin)[0, 0, 1]
        scores.append(float(rotated_q @ rotated_k))
    assert max(scores) - min(scores) < 1e-9 * max(1.0, abs(scores[0]))  # float64 angles: equal to rounding
    # and a different offset gives a different score: order matters
    cos, sin = rope_cos_sin(torch.tensor([offset + 3, 0]), 64, 100000.0, dtype=torch.float64)
    other_q = apply_rope(torch.stack([q, q])[None, None], cos, sin)[0, 0, 0]
    other_k = apply_rope(torch.stack([k, k])[None, None], cos, sin)[0, 0, 1]
    assert abs(float(other_q @ other_k) - scores[0]) > 1e-3
