"""The from-scratch model equals transformers: full, cached, padded, greedy; tiny configs and the real model."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.generate.decode import greedy_tokens
from llm_anatomy.measure.exactness import (cached_differences, eager_difference, full_difference, greedy_matches,
                                           natural_text_ids, padded_differences, padded_prompts)
from llm_anatomy.model.scratch import ScratchConfig, ScratchLlama
from llm_anatomy.texts import PROMPTS
from llm_anatomy.weights.random import random_config, random_llama

LAYOUTS = {"MHA": 4, "GQA": 2, "MQA": 1}  # key/value heads for 4 query heads


def _ids(batch, seq, seed=0, vocab=128):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ tiny random models, fast


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiny_full_forward_equals_transformers(layout):
    hf = random_llama(num_key_value_heads=LAYOUTS[layout])
    ours = ScratchLlama.from_hf(hf)
    assert ours.cfg.num_kv_heads == LAYOUTS[layout]
    for seq in [1, 5, 64, 256]:
        assert full_difference(hf, ours, _ids(2, seq, seed=seq)) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiny_cached_decode_equals_transformers(layout):
    hf = random_llama(num_key_value_heads=LAYOUTS[layout])
    result = cached_differences(hf, ScratchLlama.from_hf(hf), _ids(1, 6), steps=20)
    assert result["tokens"] == 26
    assert result["cached_vs_cached"] < 1e-5 and result["cached_vs_full"] < 1e-5


def test_tiny_cache_fed_in_chunks_equals_one_pass():
    hf = random_llama()
    ours = ScratchLlama.from_hf(hf)
    ids = _ids(2, 30)
    cache = ours.new_cache(2, 30)
    parts = [ours(ids[:, a:b], cache=cache) for a, b in [(0, 10), (10, 11), (11, 25), (25, 30)]]
    assert cache.length == 30
    assert (torch.cat(parts, dim=1) - hf(ids).logits).abs().max() < 1e-5


def test_tiny_left_padding_with_and_without_cache():
    hf = random_llama()
    ours = ScratchLlama.from_hf(hf)
    ids = _ids(3, 9)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9, [0] * 8 + [1]])
    ids[mask == 0] = 2  # the pad token
    result = padded_differences(hf, ours, ids, mask, steps=6)
    assert result["padded_full"] < 1e-5 and result["padded_cached"] < 1e-5 and result["padded_vs_alone"] < 1e-5


def test_padding_changes_nothing_for_the_real_tokens():
    hf = random_llama()
    ours = ScratchLlama.from_hf(hf)
    ids = _ids(1, 5)
    padded = torch.cat([torch.full((1, 3), 2), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    assert (ours(padded, attention_mask=mask)[:, 3:] - ours(ids)).abs().max() < 1e-5
    assert (ours(padded)[:, 3:] - ours(ids)).abs().max() > 1e-3  # without the mask the padding leaks in


def test_tiny_greedy_equals_generate():
    hf = random_llama(seed=3)
    result = greedy_matches(hf, type("Tok", (), {"pad_token_id": 2})(), ScratchLlama.from_hf(hf), _ids(1, 4), 40)
    assert result["identical"] and len(result["ours"]) == len(result["theirs"]) > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_sdpa_path_equals_the_plain_path_full_cached_and_padded(layout):
    hf = random_llama(num_key_value_heads=LAYOUTS[layout])
    plain, fused = ScratchLlama.from_hf(hf), ScratchLlama.from_hf(hf, attention="sdpa")
    assert (plain.attention, fused.attention) == ("naive", "sdpa")
    assert fused.layers[0].self_attn.q_proj.weight is plain.layers[0].self_attn.q_proj.weight  # one set of weights
    ids = _ids(3, 9)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9, [0] * 8 + [1]])
    ids[mask == 0] = 2
    with torch.no_grad():
        assert (fused(ids) - plain(ids)).abs().max() < 1e-5
        assert (fused(ids, attention_mask=mask) - plain(ids, attention_mask=mask)).abs().max() < 1e-5
        caches = [m.new_cache(3, 14) for m in (plain, fused)]
        for step in range(5):  # a padded prefill, then decode steps through the cache
            chunk = ids if step == 0 else _ids(3, 1, seed=step)
            full_mask = torch.cat([mask, torch.ones(3, step, dtype=mask.dtype)], dim=1)
            out = [m(chunk, cache=c, attention_mask=full_mask) for m, c in zip((plain, fused), caches)]
            assert (out[1] - out[0]).abs().max() < 1e-5
        assert caches[1].length == 13


def test_the_attention_path_can_be_switched_and_is_checked():
    model = ScratchLlama.from_hf(random_llama())
    model.attention = "sdpa"
    assert {b.self_attn.path for b in model.layers} == {"sdpa"}
    weights = model.attention_weights(_ids(1, 6), layer=0)  # the fused kernel keeps none: the plain path gives them
    assert torch.allclose(weights.sum(-1), torch.ones(1, 4, 6))
    with pytest.raises(CourseError, match="attention must be one of"):
        model.attention = "flash"
    with pytest.raises(CourseError, match="attention must be one of"):
        ScratchLlama.from_hf(random_llama(), attention="eager")
    assert model.attention == "sdpa"  # the refused value changed nothing


def test_trace_exposes_the_residual_stream_and_attention_weights():
    hf = random_llama()
    hf.set_attn_implementation("eager")  # so transformers returns its attention weights
    ours = ScratchLlama.from_hf(hf)
    ids = _ids(2, 12)
    ref = hf(ids, output_hidden_states=True, output_attentions=True)
    out = ours.trace(ids, attention_layers=(1,))
    assert len(out.hidden_states) == hf.config.num_hidden_layers + 1
    for mine, theirs in zip(out.hidden_states[:-1], ref.hidden_states[:-1]):
        assert (mine - theirs).abs().max() < 1e-5
    assert (ours.norm(out.hidden_states[-1]) - ref.hidden_states[-1]).abs().max() < 1e-5  # theirs is after the norm
    assert list(out.attentions) == [1]
    assert (out.attentions[1] - ref.attentions[1]).abs().max() < 1e-6
    assert (out.logits - ref.logits).abs().max() < 1e-5
    assert ours.trace(ids, keep_hidden=False).hidden_states == []


def test_attention_weights_of_one_layer_or_head():
    ours = ScratchLlama.from_hf(random_llama())
    ids = _ids(1, 10)
    traced = ours.trace(ids, attention_layers=(0, 1)).attentions
    assert torch.equal(ours.attention_weights(ids, 1), traced[1])  # the blocks' own weights, not a second copy
    assert torch.equal(ours.attention_weights(ids, 0, head=3), traced[0][:, 3])
    with pytest.raises(CourseError, match="layer must be"):
        ours.attention_weights(ids, 2)
    with pytest.raises(CourseError, match="head must be"):
        ours.attention_weights(ids, 0, head=4)


def _loss_and_gradient(model, weight, ids):
    """The training loss on `ids` (cross-entropy of each next token) and its gradient on `weight`."""
    logits = model(ids)
    logits = getattr(logits, "logits", logits)[:, :-1]  # [1, seq - 1, vocab]: each next-token prediction
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return loss, torch.autograd.grad(loss, weight)[0]


def test_the_loss_backpropagates_through_our_model_as_through_transformers():
    """Our model is differentiable: the gradient of the training loss on one weight equals transformers'."""
    hf = random_llama(seed=1, num_hidden_layers=4)
    ours = ScratchLlama.from_hf(hf)
    ids = _ids(1, 24, seed=2)
    weight = hf.model.layers[3].self_attn.q_proj.weight  # shared: ours.layers[3].self_attn.q_proj.weight
    assert weight is ours.layers[3].self_attn.q_proj.weight and not weight.requires_grad  # frozen for inference
    weight.requires_grad_(True)  # unfrozen, to take its gradient
    hf.set_attn_implementation("eager")
    loss_ours, grad_ours = _loss_and_gradient(ours, weight, ids)
    loss_theirs, grad_theirs = _loss_and_gradient(hf, weight, ids)
    assert abs(loss_ours.item() - loss_theirs.item()) < 1e-5
    assert grad_ours.abs().max() > 1e-4  # a real gradient, not zeros
    assert (grad_ours - grad_theirs).abs().max() <= 1e-5 * grad_theirs.abs().max()  # fp32 rounding


def test_weights_are_shared_not_copied():
    hf = random_llama()
    ours = ScratchLlama.from_hf(hf)
    assert ours.embed_tokens.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert ours.lm_head.weight.data_ptr() == ours.embed_tokens.weight.data_ptr()  # tied
    assert ours.layers[1].mlp.down_proj.weight.data_ptr() == hf.model.layers[1].mlp.down_proj.weight.data_ptr()
    untied = random_llama(tie_word_embeddings=False)
    mine = ScratchLlama.from_hf(untied)
    assert mine.lm_head.weight.data_ptr() == untied.lm_head.weight.data_ptr() != mine.embed_tokens.weight.data_ptr()
    assert full_difference(untied, mine, _ids(1, 7)) < 1e-5


def test_odd_head_dim_is_refused_clearly():
    from types import SimpleNamespace

    # transformers refuses such a config itself, so build one by hand, as another library's might be
    settings = {**random_config().to_dict(), "head_dim": 15}
    with pytest.raises(CourseError, match="head_dim must be even"):
        ScratchLlama(ScratchConfig.from_hf(SimpleNamespace(**settings)))
    settings = {**random_config().to_dict(), "head_dim": None, "hidden_size": 60}  # 60 / 4 heads = 15
    with pytest.raises(CourseError, match="head_dim must be even"):
        ScratchLlama(ScratchConfig.from_hf(settings))  # a dict of the config's fields reads the same


def test_rope_scaling_is_read_and_refused_clearly():
    config = random_config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    cfg = ScratchConfig.from_hf(config)  # the config reader reads it (the KV-cache formula needs no RoPE)...
    assert cfg.rope_type == "linear" and cfg.rope_theta == 10000.0
    with pytest.raises(CourseError, match="plain RoPE"):  # ...and the model, which implements plain RoPE, refuses it
        ScratchLlama(cfg)
    with pytest.raises(CourseError, match="plain RoPE"):
        ScratchLlama.from_hf(random_llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}))


def test_bad_inputs_are_refused_clearly():
    ours = ScratchLlama.from_hf(random_llama())
    with pytest.raises(CourseError, match=r"\[batch, seq\]"):
        ours(torch.tensor([1, 2, 3]))
    with pytest.raises(CourseError, match="from 0 to 127"):
        ours(torch.tensor([[1, 500]]))
    with pytest.raises(CourseError, match="no token"):
        ours(torch.zeros(1, 0, dtype=torch.long))
    context = ours.cfg.max_position_embeddings
    with pytest.raises(CourseError, match=f"context of {context}"):
        ours(_ids(1, context + 1))
    with pytest.raises(CourseError, match="batch size 2"):
        ours(_ids(1, 3), cache=ours.new_cache(2, 10))
    with pytest.raises(CourseError, match="attention_mask"):
        ours(_ids(1, 3), attention_mask=torch.ones(1, 4))


# ------------------------------------------------------------------ the real model, CPU fp32


def test_real_full_forward_within_1e_4(real, real_scratch):
    ours = real_scratch
    for n in [128, 512]:
        assert full_difference(real.model, ours, natural_text_ids(real.tokenizer, n)) < 1e-4
    for text in PROMPTS[:2]:
        assert full_difference(real.model, ours, torch.tensor([real.tokenizer.encode(text)])) < 1e-4


def test_real_model_matches_the_written_out_reference_bit_for_bit(real, real_scratch):
    """Even on 512 random tokens (far from normal text), we equal transformers' eager attention path."""
    ours = real_scratch
    ids = torch.randint(0, real.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
    assert eager_difference(real.model, ours, ids) < 1e-5
    assert real.model.config._attn_implementation == "sdpa"  # put back for the other tests


def test_real_sdpa_path_equals_the_plain_path_within_1e_4(real, real_scratch):
    plain, fused = real_scratch, ScratchLlama.from_hf(real.model, attention="sdpa")
    ids = natural_text_ids(real.tokenizer, 256)
    with torch.no_grad():
        assert (fused(ids, logits_to_keep=8) - plain(ids, logits_to_keep=8)).abs().max() < 1e-4


def test_real_cached_decode_within_1e_4(real, real_scratch):
    ours = real_scratch
    result = cached_differences(real.model, ours, torch.tensor([real.tokenizer.encode(PROMPTS[2])]), steps=16)
    assert result["cached_vs_cached"] < 1e-4
    assert result["cached_vs_full"] < 5e-4  # different summation order; measured about 1e-4


def test_real_left_padded_batch_within_1e_4(real, real_scratch):
    ours = real_scratch
    ids, mask = padded_prompts(real.tokenizer, PROMPTS)
    assert mask[0].tolist().count(0) > 0 and mask[2].all()
    result = padded_differences(real.model, ours, ids, mask, steps=6)
    assert result["padded_full"] < 1e-4 and result["padded_cached"] < 1e-4 and result["padded_vs_alone"] < 1e-4


def test_real_greedy_128_tokens_identical_to_generate(real, real_scratch, story_prompt, greedy_reference):
    theirs = greedy_reference(story_prompt, 128)  # transformers' generate, shared with test_fused
    ours = greedy_tokens(real_scratch, story_prompt, 128, eos_token_id=real.model.generation_config.eos_token_id)
    assert ours == theirs, (ours, theirs)
    assert len(ours) >= 64  # a real answer, not an immediate stop
    assert greedy_tokens(real_scratch, story_prompt, 5) == theirs[:5]


def test_real_loss_gradient_equals_transformers(real):
    """The same on the real model: the gradient on layer 3's q_proj weight, from a sentence's training loss."""
    ours = ScratchLlama.from_hf(real.model)
    ids = torch.tensor([real.tokenizer.encode(PROMPTS[2])])
    weight = real.model.model.layers[3].self_attn.q_proj.weight
    before = real.model.config._attn_implementation
    real.model.set_attn_implementation("eager")
    weight.requires_grad_(True)  # load_model freezes the weights; unfreeze the one we differentiate
    try:
        loss_ours, grad_ours = _loss_and_gradient(ours, weight, ids)
        loss_theirs, grad_theirs = _loss_and_gradient(real.model, weight, ids)
    finally:
        real.model.set_attn_implementation(before)
        weight.requires_grad_(False)
    assert abs(loss_ours.item() - loss_theirs.item()) < 1e-4
    assert (grad_ours - grad_theirs).abs().max() <= 1e-4 * grad_theirs.abs().max()  # fp32 rounding
