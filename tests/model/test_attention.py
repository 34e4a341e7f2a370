"""Our attention equals torch's scaled_dot_product_attention and the transformers layer (C4, C5, C9)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llm_anatomy import CourseError
from llm_anatomy.model.attention import (attention, attention_probabilities, causal_mask, check_attention_path,
                                        kv_head_of, repeat_kv, sdpa_attention)
from llm_anatomy.model.rope import rope_cos_sin
from llm_anatomy.model.scratch import ScratchLlama

from llm_anatomy.weights.random import random_llama


def _qkv(heads=4, kv_heads=2, seq=7, d=16, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, seq, d, generator=g), torch.randn(batch, kv_heads, seq, d, generator=g),
            torch.randn(batch, kv_heads, seq, d, generator=g))


def test_causal_mask_is_lower_triangular_and_offset_for_decoding():
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    assert causal_mask(1, 5).all()  # the newest token sees every cached position
    assert torch.equal(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    with pytest.raises(CourseError, match="more queries"):
        causal_mask(4, 2)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1), (9, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_equals_torch_scaled_dot_product_attention(heads, kv_heads, causal):
    q, k, v = _qkv(heads, kv_heads)
    ours = attention(q, k, v, causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert (ours - ref).abs().max() < 1e-5


def test_key_mask_equals_an_sdpa_boolean_mask():
    q, k, v = _qkv()
    key_mask = torch.tensor([[False, False, True, True, True, True, True], [True] * 7])
    ours = attention(q, k, v, causal=True, key_mask=key_mask)
    allowed = causal_mask(7, 7)[None, None] & key_mask[:, None, None, :]
    ref = F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=allowed)
    # a padding query sees no key: torch gives NaN there, we give zeros; compare the real queries
    assert (ours[0, :, 2:] - ref[0, :, 2:]).abs().max() < 1e-5 and (ours[1] - ref[1]).abs().max() < 1e-5
    assert torch.equal(ours[0, :, :2], torch.zeros_like(ours[0, :, :2]))


def test_weights_are_a_masked_softmax():
    q, k, v = _qkv(seq=5)
    out, weights = attention(q, k, v, return_weights=True)
    assert weights.shape == (2, 4, 5, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5))
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # nothing from the future
    assert torch.allclose(out, weights @ repeat_kv(v, 2), atol=1e-6)
    assert torch.equal(attention_probabilities(q, k), weights)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_the_copy_free_grouped_matmul_equals_the_plain_repeat_kv_path(kv_heads):
    """What Attention.forward's comment shows side by side: copying each KV head for its group (transformers'
    eager path) and attention()'s grouped rows give the same outputs and weights, to float rounding."""
    q, k, v = _qkv(heads=4, kv_heads=kv_heads, seq=9)
    n_rep = 4 // kv_heads
    plain, plain_weights = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), return_weights=True)
    grouped, weights = attention(q, k, v, return_weights=True)
    assert (grouped - plain).abs().max() < 1e-6 and (weights - plain_weights).abs().max() < 1e-6


def test_gqa_groups_query_heads_in_order():
    assert [kv_head_of(h, 9, 3) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    k = torch.arange(3.0).view(1, 3, 1, 1)
    assert repeat_kv(k, 3).flatten().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(CourseError, match="evenly"):
        kv_head_of(0, 9, 2)


def test_bad_shapes_are_refused():
    q, k, v = _qkv(heads=4, kv_heads=3)
    with pytest.raises(CourseError, match="evenly"):
        attention(q, k, v)
    with pytest.raises(CourseError, match=r"\[batch, heads, seq, head_dim\]"):
        attention(q[0], k, v)
    q, k, v = _qkv()
    with pytest.raises(CourseError, match="key_mask"):
        attention(q, k, v, key_mask=torch.ones(2, 3, dtype=torch.bool))


def test_the_causal_mask_keeps_earlier_outputs_fixed_when_tokens_are_appended():
    """C9: with the mask, appending tokens leaves earlier positions' outputs unchanged; without it, not."""
    q, k, v = _qkv(seq=8)
    for causal, should_match in [(True, True), (False, False)]:
        short = attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], causal=causal)
        long = attention(q, k, v, causal=causal)[:, :, :5]
        assert torch.allclose(short, long, atol=1e-6) == should_match


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_equals_the_transformers_attention_layer(kv_heads):
    hf = random_llama(num_key_value_heads=kv_heads)
    ours = ScratchLlama.from_hf(hf)
    torch.manual_seed(4)
    x = torch.randn(2, 9, 64)
    positions = torch.arange(9)[None].expand(2, 9)
    cos, sin = rope_cos_sin(positions, 16, 100000.0)
    mask = torch.full((9, 9), float("-inf")).triu(1)[None, None]  # additive causal mask, as transformers uses
    ref, _ = hf.model.layers[1].self_attn(x, position_embeddings=(cos, sin), attention_mask=mask)
    mine, _ = ours.layers[1].self_attn(x, cos, sin)
    assert (mine - ref).abs().max() < 1e-5


def test_equals_a_real_layer_of_the_real_model(real):
    """Hook layer 5's attention in the real model, feed the same input to ours: the same output."""
    seen = {}

    def keep(module, args, kwargs, output):
        seen["x"], seen["pos"], seen["out"] = kwargs["hidden_states"], kwargs["position_embeddings"], output[0]

    layer = real.model.model.layers[5].self_attn
    handle = layer.register_forward_hook(keep, with_kwargs=True)
    try:
        ids = real.tokenizer("The quick brown fox jumps over the lazy dog, then sleeps.", return_tensors="pt")
        with torch.no_grad():
            real.model(**ids)
    finally:
        handle.remove()
    ours = ScratchLlama.from_hf(real.model)
    cos, sin = rope_cos_sin(torch.arange(seen["x"].shape[1]), 64, 100000.0)
    assert torch.allclose(cos, seen["pos"][0][0], atol=1e-6)
    with torch.no_grad():
        mine, weights = ours.layers[5].self_attn(seen["x"], cos, sin, return_weights=True)
    assert (mine - seen["out"]).abs().max() < 1e-4
    assert weights.shape == (1, 9, seen["x"].shape[1], seen["x"].shape[1])


# ------------------------------------------------------------------ the SDPA path equals the plain one


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1), (9, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_path_equals_the_plain_path(heads, kv_heads, causal):
    q, k, v = _qkv(heads, kv_heads)
    assert (sdpa_attention(q, k, v, causal=causal) - attention(q, k, v, causal=causal)).abs().max() < 1e-5


def test_sdpa_path_with_padding_and_a_cache_equals_the_plain_path():
    q, k, v = _qkv(seq=7)
    key_mask = torch.tensor([[False, False, True, True, True, True, True], [True] * 7])
    ours, plain = sdpa_attention(q, k, v, key_mask=key_mask), attention(q, k, v, key_mask=key_mask)
    assert (ours - plain).abs().max() < 1e-5
    assert torch.equal(ours[0, :, :2], torch.zeros_like(ours[0, :, :2]))  # padding queries: zeros, not NaN
    # queries that are the last 3 of 7 positions (a chunk after a cache) and a single decode query
    for q_len in (3, 1):
        tail = q[:, :, -q_len:]
        for mask in (None, key_mask):
            assert (sdpa_attention(tail, k, v, key_mask=mask) - attention(tail, k, v, key_mask=mask)).abs().max() < 1e-5


def test_sdpa_path_in_bf16_equals_the_plain_path_to_rounding():
    q, k, v = (t.bfloat16() for t in _qkv(9, 3, seq=33))
    ours, plain = sdpa_attention(q, k, v).float(), attention(q, k, v).float()
    assert (ours - plain).abs().max() < 2e-2 * plain.abs().max()


def test_an_unknown_attention_path_is_refused():
    with pytest.raises(CourseError, match="'naive', 'sdpa'"):
        check_attention_path("flash")
    assert check_attention_path("sdpa") == "sdpa"
