"""Tests for quantize.py: our int8/int4 formats, fake quantization of the real model and its quality cost,
and the int8 KV cache. (The GGUF file by hand: tests/fast/test_gguf_blocks.py.)"""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.fast import quantize as q
from llm_anatomy.generate.decode import greedy_tokens
from llm_anatomy.measure.quality import greedy_agreement, logit_kl


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def cached():
    """The cached fp32 safetensors that transformers made from the same GGUF (opened lazily)."""
    from safetensors import safe_open

    from llm_anatomy.weights.cache import default_model_dir

    with safe_open(default_model_dir() / "model.safetensors", framework="pt") as handle:
        yield handle


# --------------------------------------------------------------------------- 1. our own formats


def test_int8_round_trip_is_within_half_a_step(cached):
    for w in (cached.get_tensor("model.layers.0.mlp.down_proj.weight"), torch.randn(64, 100) * 3):
        codes, scale = q.quantize_int8_per_channel(w)
        assert codes.dtype == torch.int8 and codes.shape == w.shape and scale.shape == (w.shape[0],)
        assert (codes.abs().amax(dim=1) == 127).all()  # each row uses the full range
        error = (q.dequantize_int8(codes, scale) - w).abs().amax(dim=1)  # [out]
        assert (error <= scale * (0.5 + 1e-5)).all()
        assert error.max() > 0.3 * scale.min()  # it does round: not a lossless copy
    codes, scale = q.quantize_int8_per_channel(torch.zeros(2, 8))
    assert torch.equal(q.dequantize_int8(codes, scale), torch.zeros(2, 8))


def test_int4_round_trip_is_within_half_a_step():
    w = torch.randn(16, 256)
    packed, scale, minimum = q.quantize_int4_groupwise(w, group_size=64)
    assert packed.dtype == torch.uint8 and packed.shape == (16, 128) and scale.shape == minimum.shape == (16, 4)
    code0 = int(torch.round((w[0, 0] - minimum[0, 0]) / scale[0, 0]))
    assert int(packed[0, 0] & 0x0F) == code0  # weight 0 in the low nibble of byte 0
    back = q.dequantize_int4(packed, scale, minimum)
    error = (back - w).abs().reshape(16, 4, 64).amax(dim=-1)  # [out, groups]
    assert (error <= scale * (0.5 + 1e-5)).all() and error.max() > 0.3 * scale.min()
    assert torch.equal(back.reshape(16, 4, 64).amin(-1), minimum)  # code 0 is each group's minimum exactly


def test_int4_group_32_is_exact_on_weights_already_in_q4_1(cached):
    """The cached weights came from Q4_1: 16 levels per block of 32. Our int4 with the same groups
    finds the same levels, so its round trip changes nothing; coarser groups of 64 do change them."""
    w = cached.get_tensor("model.layers.4.self_attn.o_proj.weight")
    assert torch.equal(q.fake_quantize(w, "int4", 32), w)
    assert not torch.equal(q.fake_quantize(w, "int4", 64), w)


def test_format_errors_and_sizes():
    with pytest.raises(CourseError, match="row length 576.*try 16 or 32 or 64"):
        q.quantize_int4_groupwise(torch.randn(4, 576), group_size=128)
    with pytest.raises(CourseError, match="even"):
        q.quantize_int4_groupwise(torch.randn(4, 576), group_size=3)
    with pytest.raises(CourseError, match="2-D"):
        q.quantize_int8_per_channel(torch.randn(10))
    for bad in (float("nan"), float("inf")):
        w = torch.randn(4, 64)
        w[2, 5] = bad
        for quantize in (q.quantize_int8_per_channel, q.quantize_int4_groupwise):
            with pytest.raises(CourseError, match="NaN or infinite"):
                quantize(w)
    for bad in (32.0, True, "32"):
        with pytest.raises(CourseError, match="group size"):
            q.quantize_int4_groupwise(torch.randn(4, 64), group_size=bad)
    assert q.bytes_per_weight("fp32") == 4 and q.bytes_per_weight("bf16") == 2
    assert q.bytes_per_weight("int8", in_features=576) == 1 + 4 / 576
    assert q.bytes_per_weight("int4", group_size=32) == 0.75 and q.bytes_per_weight("q4_1") == 0.625
    assert q.bytes_per_weight("q8_0") == 1.0625
    with pytest.raises(CourseError, match="in_features"):
        q.bytes_per_weight("int8")
    with pytest.raises(CourseError, match="int3"):
        q.bytes_per_weight("int3")


# --------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def scratch(real):
    from llm_anatomy.model.scratch import ScratchLlama

    return ScratchLlama.from_hf(real.model)


@pytest.fixture(scope="module")
def passage(real):
    from llm_anatomy.texts import python_topic

    return real.tokenizer(python_topic("assignment"), return_tensors="pt").input_ids[:, :96]  # [1, 96]


def _block_weights(cfg) -> int:
    """Weights of every block's matmuls, from the config: q and o (hidden x heads * head_dim), k and v
    (hidden x kv_heads * head_dim), gate, up and down (hidden x intermediate)."""
    attention = 2 * cfg.hidden_size * cfg.head_dim * (cfg.num_heads + cfg.num_kv_heads)
    return cfg.num_layers * (attention + 3 * cfg.hidden_size * cfg.intermediate_size)


def test_weight_bytes_per_token(scratch):
    blocks, head = _block_weights(scratch.cfg), scratch.cfg.vocab_size * scratch.cfg.hidden_size
    assert q.weight_bytes_per_token(scratch, "fp32") == 4 * (blocks + head)
    assert q.weight_bytes_per_token(scratch, "q4_1", head_fmt="q8_0") == blocks * 20 // 32 + head * 34 // 32
    int8 = q.weight_bytes_per_token(scratch, "int8")
    assert blocks + head < int8 < 1.01 * (blocks + head)  # a byte per weight, plus one fp32 scale per row


def test_fake_quantization_restores_the_weights(real, scratch):
    ours, theirs = scratch.layers[3].mlp.up_proj, real.model.model.layers[3].mlp.up_proj
    before, copy = ours.weight, theirs.weight.detach().clone()
    with q.quantize_model_weights(scratch, "int8") as changed:
        assert changed == _block_weights(scratch.cfg)  # q, o; k, v; gate, up, down
        assert ours.weight is not before and not torch.equal(ours.weight, before)
        assert torch.equal(theirs.weight, copy)  # the transformers model is untouched
    assert ours.weight is before
    head, embedding = scratch.lm_head.weight, scratch.embed_tokens.weight
    with q.quantize_model_weights(scratch, "int8", head_fmt="int8") as changed:
        assert changed == _block_weights(scratch.cfg) + scratch.lm_head.weight.numel()
        assert scratch.lm_head.weight is not head and scratch.embed_tokens.weight is embedding  # lookups stay exact
    assert scratch.lm_head.weight is head is scratch.embed_tokens.weight  # tied again
    with pytest.raises(RuntimeError), q.quantize_model_weights(scratch, "bf16"):
        raise RuntimeError("a failure inside the block")
    assert ours.weight is before
    with pytest.raises(CourseError, match="int3"), q.quantize_model_weights(scratch, "int3"):
        pass
    assert ours.weight is before
    ours.weight.data[0, 0] = float("nan")  # a broken weight: refused before anything is swapped
    try:
        with pytest.raises(CourseError, match="NaN"), q.quantize_model_weights(scratch, "int8"):
            pass
        assert ours.weight is before
    finally:
        ours.weight.data[0, 0] = copy[0, 0]


def test_int8_weights_keep_the_models_predictions(real, scratch, passage):
    prompt = real.tokenizer("The three primary colours are", return_tensors="pt").input_ids
    with torch.no_grad():
        reference = scratch(passage)  # [1, 96, vocab]
    fp32_tokens = greedy_tokens(scratch, prompt, 16)
    with q.quantize_model_weights(scratch, "int8"), torch.no_grad():
        int8_tokens = greedy_tokens(scratch, prompt, 16)
        int8_logits = scratch(passage)
    with q.quantize_model_weights(scratch, "int4", group_size=64), torch.no_grad():
        int4_logits = scratch(passage)
    # Free-running: one flipped token changes all that follow (a chat prompt about the sky measured 0.69).
    assert greedy_agreement(fp32_tokens, int8_tokens) >= 0.8  # measured 1.0
    # Teacher-forced: the top token at each of the 96 positions of the passage, given the same text.
    assert greedy_agreement(reference.argmax(-1), int8_logits.argmax(-1)) >= 0.9  # measured 0.969
    assert greedy_agreement(reference.argmax(-1), int4_logits.argmax(-1)) < 0.85  # measured 0.688
    int8_kl, int4_kl = logit_kl(reference, int8_logits), logit_kl(reference, int4_logits)
    assert 0 < int8_kl < 0.02  # measured 0.0046 nats
    assert int4_kl > 10 * int8_kl  # groups of 64 lose much more: measured 0.35 nats


# ------------------------------------------------- 2. the KV cache (the int8 weight kernels: tests/fast/test_packed.py)


def test_kv_cache_int8_round_trip(scratch, passage):
    cache = scratch.new_cache(1, 12)
    with torch.no_grad():
        scratch(passage[:, :12], cache=cache)
    k = cache.keys[5][:, :, :12]  # [1, 3 kv heads, 12 positions, 64]
    codes, scale = q.quantize_kv_int8(k)
    assert codes.dtype == torch.int8 and codes.shape == k.shape and scale.shape == (1, 3, 12, 1)
    error = (q.dequantize_kv_int8(codes, scale) - k).abs()
    assert (error <= scale * (0.5 + 1e-5)).all()
    assert q.kv_int8_max_error(k) == error.max().item() > 0
    assert q.kv_int8_max_error(k) < 0.005 * k.abs().max().item()  # under half a percent of the largest key
    assert q.kv_int8_max_error(torch.zeros(1, 1, 2, 4)) == 0.0


# C17's bytes-and-quality check (quantization_evidence): the formula's bytes against the tensors' own, on a tiny model
def _byte_counts(model):
    from llm_anatomy.model.scratch import ScratchLlama

    scratch = ScratchLlama.from_hf(model)
    per_token = {"fp32": q.weight_bytes_per_token(scratch, "fp32"), "int8": q.weight_bytes_per_token(scratch, "int8"),
                 "int4": q.weight_bytes_per_token(scratch, "int4", 32, head_fmt="int8")}
    stored = {"fp32": q.stored_weight_bytes(scratch, "fp32"), "int8": q.stored_weight_bytes(scratch, "int8"),
              "int4": q.stored_weight_bytes(scratch, "int4", 32, head_fmt="int8")}
    return scratch, per_token, stored


def test_the_byte_formula_equals_the_quantized_tensors_bytes(tiny_model):
    from llm_anatomy.claims import claim

    scratch, per_token, stored = _byte_counts(tiny_model)
    assert per_token == stored
    claim("C17", *q.quantization_evidence(per_token, stored, kl8=0.005, agree8=0.96, **_changed(scratch)))


@pytest.mark.counterfactual("C17", "a byte count per token that forgets the LM head (or int8's scales)")
def test_the_quantization_check_fails_when_the_byte_formula_is_wrong(tiny_model, monkeypatch):
    from llm_anatomy.claims import ClaimFailed, claim

    scratch, per_token, stored = _byte_counts(tiny_model)
    head = scratch.lm_head.weight.numel()
    head_bytes = round(head * q.bytes_per_weight("int8", scratch.cfg.hidden_size))
    no_head = dict(per_token, int8=per_token["int8"] - head_bytes)
    with pytest.raises(ClaimFailed, match="C17 FAILED.*differ"):
        claim("C17", *q.quantization_evidence(no_head, stored, kl8=0.005, agree8=0.96, **_changed(scratch)))
    monkeypatch.setitem(q.bytes_per_weight.__globals__, "bytes_per_weight",
                        lambda fmt, in_features=None, group_size=32: {"int8": 1.0, "int4": 0.5, "fp32": 4.0}[fmt])
    no_scales = dict(per_token, int8=q.weight_bytes_per_token(scratch, "int8"))  # codes only: a weight a byte
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        claim("C17", *q.quantization_evidence(no_scales, stored, kl8=0.005, agree8=0.96, **_changed(scratch)))


@pytest.mark.counterfactual("C17", "int8 whose quality is past its bar (a KL that is only read would pass)")
def test_the_quantization_check_fails_on_int8_quality_past_its_bar(tiny_model):
    from llm_anatomy.claims import ClaimFailed, claim

    scratch, per_token, stored = _byte_counts(tiny_model)
    for kl8, agree8 in [(0.019, 0.906), (0.08, 0.85)]:  # codes truncated; one scale a matrix (measured, real model)
        with pytest.raises(ClaimFailed, match="C17 FAILED"):
            claim("C17", *q.quantization_evidence(per_token, stored, kl8, agree8, **_changed(scratch)))


def _changed(scratch) -> dict:
    """quantize_model_weights' own count of the weights it changed (int8, an int8 head), and the formula's."""
    with q.quantize_model_weights(scratch, "int8", 32, head_fmt="int8") as changed:
        pass
    return {"changed": changed, "should_change": q.linear_weight_count(scratch.cfg)}


def test_the_quantizer_changes_every_linear_weight_the_formula_counts(tiny_model):
    scratch = _byte_counts(tiny_model)[0]
    assert _changed(scratch)["changed"] == q.linear_weight_count(scratch.cfg)
    linears = sum(m.weight.numel() for m in scratch.modules() if isinstance(m, torch.nn.Linear))
    assert q.linear_weight_count(scratch.cfg) == linears  # the blocks' Linear layers and the head: all of them


@pytest.mark.counterfactual("C17", "a quantizer that changes nothing (weights restored before the forward: KL 0)")
def test_the_quantization_check_fails_for_a_quantizer_that_changed_nothing(tiny_model):
    from llm_anatomy.claims import ClaimFailed, claim

    scratch, per_token, stored = _byte_counts(tiny_model)
    with pytest.raises(ClaimFailed, match="C17 FAILED"):  # the reviewer's world: KL 0, every top token the same
        claim("C17", *q.quantization_evidence(per_token, stored, 0.0, 1.0, **_changed(scratch)))


@pytest.mark.counterfactual("C17", "a quantizer that skips some Linear layers (the MLP's, or the head)")
def test_the_quantization_check_fails_for_a_quantizer_that_skips_layers(tiny_model):
    from llm_anatomy.claims import ClaimFailed, claim

    scratch, per_token, stored = _byte_counts(tiny_model)
    with q.quantize_model_weights(scratch, "int8", 32) as no_head:  # no head_fmt: the head stays fp32
        pass
    with pytest.raises(ClaimFailed, match="C17 FAILED"):
        claim("C17", *q.quantization_evidence(per_token, stored, 0.005, 0.96, changed=no_head,
                                              should_change=q.linear_weight_count(scratch.cfg)))
