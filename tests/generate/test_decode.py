"""The one decoding loop: prefill, decode_step, generate_greedy, and the fixed-shape (CUDA-graph) step."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.decode import (SlotWriter, StaticDecoder, decode_step, generate_greedy, greedy_tokens,
                                         left_pad, prefill)
from llm_anatomy.model.kv_cache import KVCacheInterface
from llm_anatomy.model.scratch import ScratchLlama


def test_cached_and_uncached_generation_give_identical_tokens_and_match_transformers():
    from llm_anatomy.weights.random import random_llama

    hf = random_llama(seed=3, tie_word_embeddings=False)
    model = ScratchLlama.from_hf(hf)
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    cached = generate_greedy(model, ids, 12)
    uncached = generate_greedy(model, ids, 12, use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert len(set(cached.tokens[0].tolist())) > 1  # not a degenerate repetition
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                             do_sample=False, pad_token_id=0)
    assert torch.equal(cached.tokens, theirs[:, ids.shape[1]:])


def test_timed_generation_records_each_step(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    result = generate_greedy(model, torch.tensor([[5, 6, 7]]), 4, timed=True)
    assert len(result.step_seconds) == 4 and all(t > 0 for t in result.step_seconds)
    assert result.ttft_s == result.step_seconds[0]
    assert generate_greedy(model, torch.tensor([[5]]), 3).step_seconds == []  # untimed: nothing recorded
    with pytest.raises(CourseError, match="at least 1"):
        generate_greedy(model, torch.tensor([[5]]), 0)


def test_prefill_then_decode_steps_equal_one_full_pass(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(2, 12)
    out = prefill(model, ids[:, :6], cache)
    assert out.logits.shape == (2, 1, 128) and cache.length == 6
    logits = [out.logits[:, -1]]
    for i in range(6, 9):
        logits.append(decode_step(model, ids[:, i:i + 1], cache).logits[:, -1])
    full = model(ids)  # [2, 9, vocab], no cache
    assert (torch.stack(logits, 1) - full[:, 5:]).abs().max() < 1e-5 and cache.length == 9


def test_prefill_keeps_as_many_logits_as_asked(tiny_model):
    """The speculative verify pass is a prefill that keeps the logits of every position it feeds."""
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(5))
    full = model(ids)  # [1, 7, vocab]
    cache = model.new_cache(1, 8)
    prefill(model, ids[:, :4], cache)
    kept = prefill(model, ids[:, 4:], cache, logits_to_keep=3).logits  # [1, 3, vocab]
    assert kept.shape == (1, 3, 128) and (kept - full[:, 4:]).abs().max() < 1e-5
    every = prefill(model, ids, model.new_cache(1, 8), logits_to_keep=0).logits
    assert every.shape == full.shape and (every - full).abs().max() < 1e-5


def test_a_prefill_that_fails_after_the_blocks_counts_no_position(tiny_model, monkeypatch):
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 8)
    prefill(model, torch.tensor([[5, 6]]), cache)

    def broken(x):
        raise RuntimeError("the final norm failed")

    monkeypatch.setattr(model.norm, "forward", broken)  # every block has run and the cache has advanced by now
    with pytest.raises(RuntimeError, match="final norm"):
        prefill(model, torch.tensor([[7, 8, 9]]), cache)
    assert cache.length == 2


def test_decode_step_refuses_bad_input_and_a_failed_call_counts_nothing(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    cache = model.new_cache(1, 4)
    with pytest.raises(CourseError, match="prefill"):
        decode_step(model, torch.tensor([[5]]), cache)
    prefill(model, torch.tensor([[5, 6, 7]]), cache)
    with pytest.raises(CourseError, match=r"\[batch, 1\]"):
        decode_step(model, torch.tensor([[5, 6]]), cache)
    decode_step(model, torch.tensor([[8]]), cache)
    with pytest.raises(CourseError, match="full"):
        decode_step(model, torch.tensor([[9]]), cache)
    assert cache.length == 4


def test_greedy_tokens_stop_after_the_end_token(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.tensor([[5, 6, 7]])
    tokens = generate_greedy(model, ids, 8).tokens[0].tolist()
    assert greedy_tokens(model, ids, 8) == tokens
    eos = tokens[2]
    assert greedy_tokens(model, ids, 8, eos_token_id=eos) == tokens[:tokens.index(eos) + 1]


def test_the_fixed_shape_step_gives_the_same_tokens_as_decode_step(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    decoder = StaticDecoder(model, batch=2, max_len=16)
    assert torch.equal(decoder.generate(ids, 10), generate_greedy(model, ids, 10).tokens)
    with pytest.raises(CourseError, match="do not fit"):
        decoder.generate(ids, 12)
    with pytest.raises(CourseError, match="CUDA"):
        decoder.capture()  # on the CPU: a clear refusal, never a silent fallback


def test_the_fixed_shape_step_is_the_models_own_forward_pass(tiny_model, monkeypatch):
    """StaticDecoder writes nothing of the model twice: each step is one call of the model's trace, with the slot
    writer (a KVCacheInterface) as its cache."""
    model = ScratchLlama.from_hf(tiny_model)
    decoder = StaticDecoder(model, batch=1, max_len=8)
    decoder.prefill(torch.tensor([[5, 6, 7]]))
    assert isinstance(decoder.writer, SlotWriter) and isinstance(decoder.writer, KVCacheInterface)
    caches = []
    original = model.trace
    monkeypatch.setattr(model, "trace",
                        lambda ids, cache=None, *a, **k: (caches.append(cache), original(ids, cache, *a, **k))[1])
    decoder.step()
    decoder.step()
    assert caches == [decoder.writer, decoder.writer] and int(decoder.pos) == 5


def test_the_fixed_shape_step_traces_without_a_graph_break(tiny_model):
    """What notebook 09 claims (C20): torch.compile can take the whole step, since no value is read back to Python."""
    import torch._dynamo as dynamo

    decoder = StaticDecoder(ScratchLlama.from_hf(tiny_model), batch=1, max_len=8)
    decoder.prefill(torch.tensor([[5, 6, 7]]))
    try:
        with torch.inference_mode():
            assert dynamo.explain(decoder._step)().graph_break_count == 0
    finally:
        dynamo.reset()


def test_left_pad_puts_every_prompt_last_token_in_the_last_column(tiny_model):
    ids, mask = left_pad([[5, 6, 7], [8], [9, 10]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8], [2, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    model = ScratchLlama.from_hf(tiny_model)
    padded = prefill(model, ids, model.new_cache(3, 8), attention_mask=mask).logits[1, -1]
    alone = prefill(model, torch.tensor([[8]]), model.new_cache(1, 8)).logits[0, -1]
    assert (padded - alone).abs().max() < 1e-5  # with the mask, a padded prompt reads as if it were alone
    for bad in ([], [[5], []]):
        with pytest.raises(CourseError, match="left_pad"):
            left_pad(bad)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_an_attention_mask_made_on_the_cpu_serves_ids_on_any_device(tiny_model, device):
    """A mask built on the CPU beside ids on a GPU once raised a device mismatch: the model now moves it to the ids.

    On a CPU-only machine this runs the CPU case; tools/gpu_check.sh runs it on a GPU, where the bug lived.
    """
    model = ScratchLlama.from_hf(tiny_model).to(device)
    ids = torch.tensor([[0, 0, 5, 6, 7], [4, 5, 6, 7, 8]], device=device)  # the first row is left-padded
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # made on the CPU, as a tokenizer makes it
    got = prefill(model, ids, model.new_cache(2, 8), attention_mask=mask).logits
    want = prefill(model, ids, model.new_cache(2, 8), attention_mask=mask.to(device)).logits
    assert got.device.type == device and torch.equal(got, want)
    assert torch.equal(model(ids, attention_mask=mask), model(ids, attention_mask=mask.to(device)))  # no cache
    weights = model.attention_weights(ids, 1, attention_mask=mask)  # [batch, heads, seq, seq]
    assert weights.device.type == device and float(weights[0, :, 2:, :2].abs().max()) == 0.0  # padding unseen
