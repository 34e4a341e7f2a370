"""The model with one thing changed (C3, C5, C9): each change reaches every layer, and each shows what it should."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.model import ablations
from llm_anatomy.model.ablations import (cached_vs_full, check_shifted, kv_heads_read, kv_repeated, logits_with,
                                         mask_off, positions_shifted, relative_change)
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.random import random_llama



@pytest.fixture(scope="module")
def model():
    return ScratchLlama.from_hf(random_llama(num_hidden_layers=3))  # 4 query heads over 2 K/V heads


def _ids(seq=9, seed=0):
    return torch.randint(3, 128, (1, seq), generator=torch.Generator().manual_seed(seed))


def test_the_true_grouping_and_the_copy_change_nothing_a_wrong_grouping_changes_the_logits(model):
    ids = _ids()
    plain = logits_with(model, ids)
    heads, kv = model.cfg.num_heads, model.cfg.num_kv_heads
    true = logits_with(model, ids, lambda m: kv_heads_read(m, [h // (heads // kv) for h in range(heads)]))
    wrong = logits_with(model, ids, lambda m: kv_heads_read(m, [h % kv for h in range(heads)]))
    copied = logits_with(model, ids, kv_repeated)
    assert relative_change(plain, true) == 0 and relative_change(plain, copied) < 1e-6
    assert relative_change(plain, wrong) > 1e-2
    assert torch.equal(logits_with(model, ids), plain)  # nothing is left changed after the block


def test_a_change_that_never_reaches_the_model_is_refused(model, monkeypatch):
    ids = _ids()
    monkeypatch.setattr(ablations, "_attention_replaced", _never_reaches)
    with pytest.raises(CourseError, match="reached 0 attention calls"):
        logits_with(model, ids, kv_repeated)
    reached = []
    with pytest.raises(CourseError, match="reached 0 forward passes"):
        check_shifted(reached)


def _never_reaches(model, replacement):
    import contextlib

    return contextlib.nullcontext([])


def test_bad_groupings_and_shifts_are_refused(model):
    with pytest.raises(CourseError, match="one K/V head"):
        with kv_heads_read(model, [0, 1]):
            pass
    with pytest.raises(CourseError, match="one K/V head"):
        with kv_heads_read(model, [0, 1, 2, 0]):
            pass
    with pytest.raises(CourseError, match="whole number"):
        with positions_shifted(model, -1):
            pass
    with pytest.raises(CourseError, match="at least 2 tokens"):
        cached_vs_full(model, _ids(1))


def test_shifting_every_position_leaves_the_attention_weights_a_swap_changes_them(model):
    ids = _ids()
    plain = model.attention_weights(ids, 1)
    with positions_shifted(model, 500) as reached:
        shifted = model.attention_weights(ids, 1)
    check_shifted(reached)
    assert relative_change(plain, shifted) < 1e-4
    swapped = ids.clone()
    swapped[0, [2, 6]] = ids[0, [6, 2]]
    assert relative_change(plain, model.attention_weights(swapped, 1)) > 1e-2
    assert torch.equal(model.attention_weights(ids, 1), plain)  # the model's own rope is back


def test_with_the_mask_cached_decode_equals_the_full_pass_without_it_they_part_from_layer_1(model):
    ids = _ids()
    on = cached_vs_full(model, ids, masked=True)
    off = cached_vs_full(model, ids, masked=False)
    assert len(on.per_layer) == model.cfg.num_layers and on.masked and not off.masked
    assert max(on.per_layer) < 1e-5 and on.logits < 1e-5
    assert off.per_layer[0] < 1e-5  # layer 0's keys and values come from the embeddings: they cannot go stale
    assert min(off.per_layer[1:]) > 1e-3 and off.logits > 1e-3
    with mask_off(model) as reached:
        model(ids)
    assert len(reached) == model.cfg.num_layers


def test_heads_ablated_zeroes_only_the_chosen_heads_and_refuses_a_head_that_does_not_exist(tiny_model):
    from llm_anatomy.errors import CourseError
    from llm_anatomy.model.ablations import heads_ablated
    from llm_anatomy.model.scratch import ScratchLlama

    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, model.cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    seen = {}
    handle = model.layers[0].self_attn.o_proj.register_forward_hook(  # what o_proj itself was given
        lambda m, a, out: seen.update(x=a[0].clone()))
    try:
        plain = model(ids)
        before = seen["x"]
        with heads_ablated(model, [(0, 1)]) as reached:
            changed = model(ids)
        after = seen["x"]
    finally:
        handle.remove()
    d = model.cfg.head_dim
    assert reached == [1] and not torch.equal(plain, changed)
    assert torch.equal(after[..., d:2 * d], torch.zeros_like(after[..., d:2 * d]))  # head 1 silenced
    assert torch.equal(after[..., :d], before[..., :d])  # head 0 as it was
    assert torch.equal(model(ids), plain)  # and the model itself unchanged afterwards
    with pytest.raises(CourseError, match="no head 99"):
        with heads_ablated(model, [(0, 99)]):
            pass


def test_rope_interleaved_on_interleaved_rows_gives_the_plain_model_and_rope_off_turns_nothing(tiny_model):
    import copy

    from llm_anatomy.model.ablations import rope_interleaved, rope_off
    from llm_anatomy.model import scratch as scratch_module

    model = ScratchLlama.from_hf(tiny_model)
    cfg, d = model.cfg, model.cfg.head_dim
    ids = torch.randint(3, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    plain = model(ids)
    # the rows of q_proj and k_proj of every head reordered to the interleaved layout (what a GGUF converter writes)
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()  # 0, d/2, 1, ...
    permuted = copy.deepcopy(model)
    for block in permuted.layers:
        for proj, heads in ((block.self_attn.q_proj, cfg.num_heads), (block.self_attn.k_proj, cfg.num_kv_heads)):
            w = proj.weight.data.view(heads, d, -1)
            proj.weight.data = w[:, order].reshape(heads * d, -1).clone()
    with rope_interleaved(permuted) as reached:
        same = permuted(ids)
    assert len(reached) == 2 * cfg.num_layers
    assert torch.allclose(same, plain, atol=1e-5)  # the right pairing for those rows: the same model
    with rope_interleaved(model):
        assert not torch.allclose(model(ids), plain, atol=1e-3)  # the wrong pairing for the stored rows
    real = scratch_module.apply_rope
    with rope_off(model) as reached:
        unturned = model(ids)
    scratch_module.apply_rope = lambda x, cos, sin: x
    try:
        assert reached == [1] and torch.allclose(unturned, model(ids), atol=1e-6)
    finally:
        scratch_module.apply_rope = real
    assert torch.equal(model(ids), plain)  # everything put back


def test_residual_mlps_and_final_norm_off_compute_what_they_say_and_leave_the_model_as_it_was(tiny_model):
    from llm_anatomy.model.ablations import attention_off, final_norm_constant, final_norm_off, mlps_off, residual_off

    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, model.cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    plain = model(ids)
    x = model.embed_tokens(ids)
    cos, sin = model.rope(torch.arange(5))
    by_hand = {"residual": x, "mlps": x, "attention": x}
    for block in model.layers:  # each variant written out
        by_hand["attention"] = by_hand["attention"] + block.mlp(block.post_attention_layernorm(by_hand["attention"]))
        attn, _ = block.self_attn(block.input_layernorm(by_hand["residual"]), cos, sin)
        by_hand["residual"] = block.mlp(block.post_attention_layernorm(attn))
        by_hand["mlps"] = by_hand["mlps"] + block.self_attn(block.input_layernorm(by_hand["mlps"]), cos, sin)[0]
    layers = model.cfg.num_layers
    for change, want, reached_want in ((residual_off, model.lm_head(model.norm(by_hand["residual"])), layers),
                                       (mlps_off, model.lm_head(model.norm(by_hand["mlps"])), layers),
                                       (attention_off, model.lm_head(model.norm(by_hand["attention"])), layers)):
        with change(model) as reached:
            got = model(ids)
        assert len(reached) == reached_want and torch.allclose(got, want, atol=1e-5), change.__name__
    with final_norm_off(model) as reached:
        got = model(ids)
    stream = model.trace(ids).hidden_states[-1]
    assert reached == [1] and torch.allclose(got, model.lm_head(stream), atol=1e-5)
    with final_norm_constant(model) as reached:
        got = model(ids)
    one_scale = stream / stream.pow(2).mean().add(model.norm.eps).sqrt()  # one number for every position
    assert reached == [1] and torch.allclose(got, model.lm_head(model.norm.weight * one_scale), atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)  # per-position scales differ, so it is not the norm itself
    assert torch.equal(model(ids), plain)  # every forward put back
