"""Notebook 06's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch06

solutions = load_solutions("ch06")


def test_solutions_pass():
    assert ch06.check_kv_cache_bytes(solutions.kv_cache_bytes).passed
    assert ch06.check_users_that_fit(solutions.users_that_fit).passed
    assert ch06.check_generate_with_cache(solutions.generate_with_cache).passed
    assert ch06.check_cache_update(solutions.update).passed


def test_the_config_solution_matches_the_library_on_the_published_configs_and_real_tensors():
    from llm_anatomy.measure.kv_memory import LAYOUT_CONFIGS, kv_cache_bytes_from_config, layout_name
    from llm_anatomy.model.kv_cache import kv_cache_bytes

    for name, config in LAYOUT_CONFIGS.items():
        for context in (1, 3000, 100_000):
            assert solutions.kv_cache_bytes(config, context, 2) == kv_cache_bytes_from_config(config, context, 2)
    assert {layout_name(c) for c in LAYOUT_CONFIGS.values()} == {"MHA", "GQA", "MQA", "MLA", "sliding", "hybrid"}
    smol = dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_cache_bytes_from_config(smol, 100, 4) == 46_080 * 100  # the figure notebook 06 counts on real tensors
    assert kv_cache_bytes_from_config(LAYOUT_CONFIGS["DeepSeek-V3"], 1, 2) == 61 * 576 * 2
    assert kv_cache_bytes_from_config(LAYOUT_CONFIGS["Mistral-7B-v0.1"], 10_000, 2) == 2 * 8 * 128 * 2 * 32 * 4096


def _sol(**change):
    """The solution run on a changed copy of the config: one typical mistake."""
    def wrong(config, context, size):
        config = dict(config)
        for key, value in change.items():
            config[key] = value(config) if callable(value) else value
        return solutions.kv_cache_bytes(config, context, size)
    return wrong


def test_config_mistakes_are_named():
    keys_only = lambda c, n, b: solutions.kv_cache_bytes(c, n, b) // (1 if c.get("kv_lora_rank") else 2)  # noqa: E731
    not_yet(ch06.check_kv_cache_bytes(keys_only), "K AND V")
    mla_twice = lambda c, n, b: solutions.kv_cache_bytes(c, n, b) * (2 if c.get("kv_lora_rank") else 1)  # noqa: E731
    not_yet(ch06.check_kv_cache_bytes(mla_twice), "no factor 2")
    not_yet(ch06.check_kv_cache_bytes(_sol(kv_lora_rank=None)), "MLA config")
    not_yet(ch06.check_kv_cache_bytes(_sol(qk_rope_head_dim=0)), "RoPE key")
    not_yet(ch06.check_kv_cache_bytes(_sol(sliding_window=None, layer_types=None)), "sliding_window")
    not_yet(ch06.check_kv_cache_bytes(_sol(layer_types=None)), "full_attention")
    not_yet(ch06.check_kv_cache_bytes(_sol(num_key_value_heads=lambda c: c.get("num_key_value_heads", 1))), "MHA")
    not_yet(ch06.check_kv_cache_bytes(_sol(head_dim=None)), "head_dim")
    not_yet(ch06.check_kv_cache_bytes(lambda c, n, b: solutions.kv_cache_bytes(c, 1, b)), "ONE token")
    not_yet(ch06.check_kv_cache_bytes(lambda c, n, b: 1), "expected")
    not_yet(ch06.check_kv_cache_bytes(unattempted), "not attempted")


def test_the_library_is_refused_alias_proof():
    from llm_anatomy.measure import kv_memory

    shortcut = kv_memory.kv_cache_bytes_from_config
    not_yet(ch06.check_kv_cache_bytes(lambda c, n, b: shortcut(c, n, b)), "don't call", "kv_cache_bytes_from_config")


def test_wrong_numbers_get_hints():
    assert "weights" in ch06.check_users_that_fit(80).message
    assert "GiB" in ch06.check_users_that_fit(59).message  # counted the memory as 80e9 bytes
    assert "round down" in ch06.check_users_that_fit(66).message
    assert "whole number" in ch06.check_users_that_fit(65.5).message
    assert not ch06.check_users_that_fit(None)


def test_cached_loop_mistakes():
    def no_cache(model, ids, n, stop_ids):  # recomputes everything: right tokens, wrong method
        new = []
        for _ in range(n):
            nxt = model(ids)[:, -1:].argmax(-1)
            new.append(int(nxt))
            if int(nxt) in stop_ids:
                return new, "stop"
            ids = torch.cat([ids, nxt], dim=1)
        return new, "length"

    def whole_sequence_with_cache(model, ids, n, stop_ids):
        cache = model.new_cache(1, ids.shape[1] + n)
        new, seq = [], ids
        logits = model(seq, cache)
        for _ in range(n):
            nxt = logits[:, -1:].argmax(-1)
            new.append(int(nxt))
            seq = torch.cat([seq, nxt], dim=1)
            logits = model(seq, cache)
        return new, "length"

    def cache_per_step(model, ids, n, stop_ids):
        logits = model(ids, model.new_cache(1, 32))
        new = []
        for _ in range(n):
            nxt = logits[:, -1:].argmax(-1)
            new.append(int(nxt))
            if int(nxt) in stop_ids:
                return new, "stop"
            logits = model(nxt, model.new_cache(1, 32))
        return new, "length"

    def library(model, ids, n, stop_ids):
        from llm_anatomy.generate.decode import generate_greedy

        return generate_greedy(model, ids, n).tokens[0].tolist(), "length"

    def ignores_stop(model, ids, n, stop_ids):
        return solutions.generate_with_cache(model, ids, n, set())

    not_yet(ch06.check_generate_with_cache(no_cache), "no cache")
    not_yet(ch06.check_generate_with_cache(whole_sequence_with_cache), "only the newest token")
    not_yet(ch06.check_generate_with_cache(cache_per_step), "ONE before the loop")
    not_yet(ch06.check_generate_with_cache(library), "the loop is the exercise")
    not_yet(ch06.check_generate_with_cache(ignores_stop), "went on after the stop")
    not_yet(ch06.check_generate_with_cache(lambda m, ids, n, s: solutions.generate_with_cache(m, ids, n, s)[0]),
            "two things")
    not_yet(ch06.check_generate_with_cache(unattempted), "not attempted")


def test_cache_update_mistakes():
    def at_zero(self, layer, k, v):
        new = k.shape[2]
        self.keys[layer][:, :, :new] = k
        self.values[layer][:, :, :new] = v
        return self.keys[layer][:, :, :self.length + new], self.values[layer][:, :, :self.length + new]

    def only_new(self, layer, k, v):
        solutions.update(self, layer, k, v)
        return k, v

    def every_slot(self, layer, k, v):
        solutions.update(self, layer, k, v)
        return self.keys[layer], self.values[layer]

    def advances(self, layer, k, v):
        out = solutions.update(self, layer, k, v)
        self.length += k.shape[2]
        return out

    def copies(self, layer, k, v):
        keys = torch.cat([self.keys[layer][:, :, :self.length], k], dim=2)
        values = torch.cat([self.values[layer][:, :, :self.length], v], dim=2)
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length:end], self.values[layer][:, :, self.length:end] = k, v
        return keys, values

    not_yet(ch06.check_cache_update(at_zero), "position 0")
    not_yet(ch06.check_cache_update(only_new), "only the new")
    not_yet(ch06.check_cache_update(every_slot), "unwritten")
    not_yet(ch06.check_cache_update(advances), "length changed")
    not_yet(ch06.check_cache_update(copies), "a view")
    not_yet(ch06.check_cache_update(lambda self, layer, k, v: None), "None", "(keys, values)")
    not_yet(ch06.check_cache_update(unattempted), "not attempted")
