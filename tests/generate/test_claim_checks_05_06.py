"""The checks of claims C7, C8 and C10 that notebooks 05 and 06 call, each in its true world and in counterfactual
worlds (plausible bugs, or an engine without the mechanism) where it must raise ClaimFailed.

Cheap: a tiny random Llama whose weights are drawn 10x wider than transformers' default (initializer_range 0.2), so
its logits and keys carry real differences between positions (at the default 0.02 a RoPE shift moves the logits by
only 1e-3). The same checks run on the real model in the notebooks (and in tests/test_claim_cells_05_07.py).
"""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.claims import ClaimFailed
from llm_anatomy.generate import decode
from llm_anatomy.generate.decode import Generation
from llm_anatomy.generate.decode_check import check_decode, full_pass_logits, trace_greedy
from llm_anatomy.measure.cache_speedup import CountedRun, check_cache_speedup, time_cache_runs
from llm_anatomy.measure.kv_memory import check_kv_bytes, measure_kv_bytes
from llm_anatomy.model import kv_cache as kv_cache_module
from llm_anatomy.model.kv_cache import KVCache, check_prefill_cache, kv_cache_bytes, transformers_prefill_kv
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.random import random_llama


@pytest.fixture(scope="module")
def pair():
    hf = random_llama(seed=1, initializer_range=0.2)
    return hf, ScratchLlama.from_hf(hf)


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(3, 128, (1, 32), generator=torch.Generator().manual_seed(0))  # [1, 32]


def new_cache(model, cls=KVCache, length=48):
    cfg = model.cfg
    return cls.allocate(cfg.num_layers, 1, cfg.num_kv_heads, length, cfg.head_dim)


def c8(pair, prompt, **kw):
    hf, model = pair
    trace = trace_greedy(model, prompt, 12, **kw)
    return check_decode(trace, full_pass_logits(hf, prompt, trace.tokens))


# ------------------------------------------------------------------ C8 (notebook 05): logits, tokens fed, cache growth


def test_c8_holds_for_the_course_loop(pair, prompt):
    assert "C8 holds" in str(c8(pair, prompt))


def shift_decode_positions(monkeypatch, shift):
    """The loop passes each decode step's RoPE position off by `shift` (the positions are the caller's to give)."""
    real_step = decode.decode_step
    monkeypatch.setattr(decode, "decode_step", lambda model, ids, cache, **kw: real_step(
        model, ids, cache, positions=torch.tensor([cache.length + shift]), **kw))


@pytest.mark.counterfactual("C8", "decode steps' RoPE positions shifted by +1, +3 or +8")
@pytest.mark.parametrize("shift", [1, 3, 8])
def test_c8_fails_when_decode_positions_are_shifted(pair, prompt, shift, monkeypatch):
    shift_decode_positions(monkeypatch, shift)
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        c8(pair, prompt)


class NotAppended(KVCache):
    """Attention sees the new K and V, but the cache never stores a decode step's: the next step misses them."""

    def update(self, layer, k, v):
        if k.shape[2] > 1:
            return super().update(layer, k, v)
        keys = torch.cat([self.keys[layer][:, :, :self.length], k], dim=2)
        return keys, torch.cat([self.values[layer][:, :, :self.length], v], dim=2)


class NewestDropped(KVCache):
    """A decode step stores its K and V but attends only to the earlier positions (off by one at the end)."""

    def update(self, layer, k, v):
        keys, values = super().update(layer, k, v)
        return (keys[:, :, :-1], values[:, :, :-1]) if k.shape[2] == 1 else (keys, values)


@pytest.mark.counterfactual("C8", "a decode step's K and V never appended to the cache")
def test_c8_fails_when_the_cache_is_not_appended(pair, prompt):
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        c8(pair, prompt, cache=new_cache(pair[1], NotAppended))


@pytest.mark.counterfactual("C8", "a decode step attends without the newest token's own K and V")
def test_c8_fails_when_the_newest_kv_is_dropped(pair, prompt):
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        c8(pair, prompt, cache=new_cache(pair[1], NewestDropped))


@pytest.mark.counterfactual("C8", "the whole sequence fed at every step (no cache): same logits, more tokens fed")
def test_c8_fails_when_every_step_feeds_the_whole_sequence(pair, prompt):
    hf, model = pair
    trace = trace_greedy(model, prompt, 12, use_cache=False)
    assert trace.fed == [32 + i for i in range(12)]  # what the model saw
    reference = full_pass_logits(hf, prompt, trace.tokens)
    assert (trace.logits - reference).abs().max() < 1e-4  # the logits cannot tell: only the count can
    with pytest.raises(ClaimFailed, match="C8 FAILED.*then 1 a step: False"):
        check_decode(trace, reference)


@pytest.mark.counterfactual("C8", "a decode step feeds the last two tokens, rewriting the previous position")
def test_c8_fails_when_a_step_feeds_two_tokens(pair, prompt, monkeypatch):
    real_prefill = decode.prefill

    def two_tokens(model, token_ids, cache, **kw):  # the previous token again, over its own position
        cache.length -= 1
        previous = cache_tokens[-1] if cache_tokens else token_ids
        cache_tokens.append(token_ids)
        return real_prefill(model, torch.cat([previous, token_ids], 1), cache, **kw)

    cache_tokens = []
    monkeypatch.setattr(decode, "decode_step", two_tokens)
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        c8(pair, prompt)


@pytest.mark.counterfactual("C8", "the cached loop loses the prompt's first position")
def test_c8_fails_when_the_cache_loses_the_first_position(pair, prompt, monkeypatch):
    real_prefill = decode.prefill
    monkeypatch.setattr(decode, "prefill", lambda model, ids, cache, **kw: real_prefill(model, ids[:, 1:], cache, **kw)
                        if cache.length == 0 else real_prefill(model, ids, cache, **kw))
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        c8(pair, prompt)


# ------------------------------------------------------------------ C8 (notebook 06): the time the cache saves


def counted(seconds, fed, new=8, tokens=None):
    tokens = torch.zeros(1, new, dtype=torch.long) if tokens is None else tokens
    return CountedRun(Generation(tokens, [seconds / new] * new), fed, prompt_tokens=9)


def test_c8_speedup_holds_when_the_cache_is_faster_and_feeds_one_token_a_step():
    runs = {"with": counted(1.0, [9] + [1] * 7), "without": counted(3.0, [9 + i for i in range(8)])}
    assert "C8 holds" in str(check_cache_speedup(runs, on_gpu=False))


@pytest.mark.counterfactual("C8", "both runs without a cache (06's timing): no speed-up, the same tokens fed")
def test_c8_speedup_fails_for_two_uncached_runs(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    runs = time_cache_runs(model, torch.tensor([[5, 6, 7, 8]]), 6, "cpu", uses_cache={"with": False, "without": False})
    assert runs["with"].fed == [4, 5, 6, 7, 8, 9]
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        check_cache_speedup(runs, on_gpu=False)
    with pytest.raises(ClaimFailed, match="C8 FAILED"):  # on a GPU too: the counts do not depend on the clock
        check_cache_speedup(runs, on_gpu=True)


@pytest.mark.counterfactual("C8", "a cache that feeds one token a step but saves too little time (below the margin)")
def test_c8_speedup_fails_below_the_margin():
    runs = {"with": counted(1.0, [9] + [1] * 7), "without": counted(1.3, [9 + i for i in range(8)])}
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        check_cache_speedup(runs, on_gpu=False)


@pytest.mark.counterfactual("C8", "a decode step that feeds one token but attends to nothing cached (fast, other tokens)")
def test_c8_speedup_fails_when_the_fast_run_made_other_tokens():
    forgetful = torch.arange(8)[None]  # what a step without its cache chose: not the full recompute's tokens
    runs = {"with": counted(1.0, [9] + [1] * 7, tokens=forgetful), "without": counted(3.0, [9 + i for i in range(8)])}
    with pytest.raises(ClaimFailed, match="C8 FAILED.*the same tokens: False"):
        check_cache_speedup(runs, on_gpu=False)


@pytest.mark.counterfactual("C8", "a prefill that feeds one token of the prompt, then one a step (the prompt lost)")
def test_c8_speedup_fails_when_the_prefill_did_not_feed_the_prompt():
    runs = {"with": counted(1.0, [1] * 8), "without": counted(3.0, [9 + i for i in range(8)])}
    with pytest.raises(ClaimFailed, match="C8 FAILED.*then one a step: False"):
        check_cache_speedup(runs, on_gpu=False)


def test_c8_speedup_counts_what_the_model_was_fed(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    runs = time_cache_runs(model, torch.tensor([[5, 6, 7, 8]]), 6, "cpu")
    assert runs["with"].fed == [4, 1, 1, 1, 1, 1] and runs["without"].fed == [4, 5, 6, 7, 8, 9]
    assert torch.equal(runs["with"].generation.tokens, runs["without"].generation.tokens)
    assert len(runs["with"].generation.step_seconds) == 6


# ------------------------------------------------------------------ C7 (notebook 06): every layer's K and V, stored


def prefilled(pair, prompt, cls=KVCache):
    hf, model = pair
    cache = new_cache(model, cls)
    model(prompt, cache)
    return cache, transformers_prefill_kv(hf, prompt)


def c7(pair, prompt, cache, theirs):
    return check_prefill_cache(cache, theirs, prompt.shape[1], kv_cache_bytes(pair[0].config, prompt.shape[1],
                                                                                dtype=torch.float32))


def test_c7_holds_after_a_prefill(pair, prompt):
    assert "C7 holds" in str(c7(pair, prompt, *prefilled(pair, prompt)))


@pytest.mark.counterfactual("C7", "every stored value zeroed after the prefill")
def test_c7_fails_when_the_values_are_zeroed(pair, prompt):
    cache, theirs = prefilled(pair, prompt)
    for values in cache.values:
        values.zero_()
    with pytest.raises(ClaimFailed, match="C7 FAILED"):
        c7(pair, prompt, cache, theirs)


@pytest.mark.counterfactual("C7", "the keys of every layer but the first zeroed after the prefill")
def test_c7_fails_when_later_layers_keys_are_zeroed(pair, prompt):
    cache, theirs = prefilled(pair, prompt)
    for keys in cache.keys[1:]:
        keys.zero_()
    with pytest.raises(ClaimFailed, match="C7 FAILED.*layer 1 K"):
        c7(pair, prompt, cache, theirs)


@pytest.mark.counterfactual("C7", "one prompt position missing from the cache (never written)")
def test_c7_fails_when_one_position_is_missing(pair, prompt):
    cache, theirs = prefilled(pair, prompt)
    for t in cache.keys + cache.values:
        t[:, :, 17] = 0
    with pytest.raises(ClaimFailed, match="C7 FAILED.*position 17"):
        c7(pair, prompt, cache, theirs)


@pytest.mark.counterfactual("C7", "the prefill stores one position fewer than the prompt (length off by one)")
def test_c7_fails_when_the_length_is_short(pair, prompt):
    cache, theirs = prefilled(pair, prompt)
    cache.length -= 1
    with pytest.raises(ClaimFailed, match="C7 FAILED"):
        c7(pair, prompt, cache, theirs)


class LastOnly(KVCache):
    """A cache that keeps only the newest position of each call (a prefill leaves the earlier ones empty)."""

    def update(self, layer, k, v):
        end = self.length + k.shape[2]
        self.keys[layer][:, :, end - 1:end] = k[:, :, -1:]
        self.values[layer][:, :, end - 1:end] = v[:, :, -1:]
        return k, v  # attention still sees this call's own K and V


@pytest.mark.counterfactual("C7", "a cache that stores only the last position of the prefill")
def test_c7_fails_when_only_the_last_position_is_stored(pair, prompt):
    cache, theirs = prefilled(pair, prompt, LastOnly)
    with pytest.raises(ClaimFailed, match="C7 FAILED"):
        c7(pair, prompt, cache, theirs)


@pytest.mark.counterfactual("C7", "keys stored before RoPE rotates them")
def test_c7_fails_when_the_keys_are_stored_unrotated(pair, prompt, monkeypatch):
    hf, model = pair
    cache, theirs = prefilled(pair, prompt)
    with torch.inference_mode():  # layer 0's keys as k_proj gives them, no rotation
        x = model.layers[0].input_layernorm(model.embed_tokens(prompt))
        k = model.layers[0].self_attn.k_proj(x).view(1, prompt.shape[1], -1, model.cfg.head_dim).transpose(1, 2)
    cache.keys[0][:, :, :prompt.shape[1]] = k
    with pytest.raises(ClaimFailed, match="C7 FAILED.*layer 0 K"):
        c7(pair, prompt, cache, theirs)


# ------------------------------------------------------------------ C10 (notebook 06): bytes against the formula


@pytest.fixture(scope="module")
def measured(pair, prompt):
    return measure_kv_bytes(pair[0], prompt, (8, 16), (1, 3))


def ours_after(pair, prompt, tokens=8):
    cache = new_cache(pair[1])
    pair[1](prompt[:, :tokens], cache)
    return {(tokens, 1): cache.used_bytes()}


def test_c10_holds_on_the_measured_bytes(pair, prompt, measured):
    per_token = 2 * 2 * 2 * 16 * 4  # 2 (K, V) x 2 layers x 2 KV heads x 16 x 4 bytes
    assert measured == {(8, 1): 8 * per_token, (8, 3): 24 * per_token, (16, 1): 16 * per_token,
                        (16, 3): 48 * per_token}
    verdict = check_kv_bytes(pair[0].config, measured, torch.float32, ours_after(pair, prompt))
    assert "C10 holds" in str(verdict)


@pytest.mark.counterfactual("C10", "a cache that reserves a maximum length (transformers' StaticCache)")
def test_c10_fails_for_a_cache_that_reserves_max_length(pair, prompt):
    from transformers import StaticCache

    reserved = measure_kv_bytes(pair[0], prompt, (8, 16), (1,), new_cache=lambda config: StaticCache(config, 32))
    assert reserved[(8, 1)] == reserved[(16, 1)]  # no growth with length
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(pair[0].config, reserved | {(8, 3): 3 * reserved[(8, 1)]}, torch.float32)


@pytest.mark.counterfactual("C10", "our cache's bytes counted as its reservation (max_len) instead of its tokens")
def test_c10_fails_when_ours_counts_the_reservation(pair, prompt, measured):
    cache = new_cache(pair[1])
    pair[1](prompt[:, :8], cache)
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(pair[0].config, measured, torch.float32, {(8, 1): cache.allocated_bytes()})


@pytest.mark.counterfactual("C10", "a formula that forgets the factor 2 for K and V")
def test_c10_fails_when_the_formula_forgets_k_and_v(pair, prompt, measured, monkeypatch):
    real = kv_cache_module.kv_bytes
    monkeypatch.setattr(kv_cache_module, "kv_bytes", lambda *a, **kw: real(*a, **kw) // 2)
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(pair[0].config, measured, torch.float32)


@pytest.mark.counterfactual("C10", "a formula that counts query heads instead of KV heads")
def test_c10_fails_when_the_formula_counts_query_heads(pair, prompt, measured, monkeypatch):
    config = pair[0].config
    monkeypatch.setattr(kv_cache_module, "kv_layout",
                        lambda c: (c.num_hidden_layers, c.num_attention_heads, c.head_dim))
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(config, measured, torch.float32)


@pytest.mark.counterfactual("C10", "a cache whose users share one row (no growth with users)")
def test_c10_fails_when_users_share_one_row(pair, prompt, measured):
    shared = {(t, b): measured[(t, 1)] for t, b in measured}
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(pair[0].config, shared, torch.float32)


@pytest.mark.counterfactual("C10", "bytes measured at one length and one batch only (growth not shown)")
def test_c10_fails_without_two_lengths_and_two_batches(pair, prompt, measured):
    with pytest.raises(ClaimFailed, match="C10 FAILED"):
        check_kv_bytes(pair[0].config, {(8, 1): measured[(8, 1)], (8, 3): measured[(8, 3)]}, torch.float32)
