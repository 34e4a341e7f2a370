"""Notebook 06's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch06

solutions = load_solutions("ch06")


def test_solutions_pass():
    assert ch06.check_kv_bytes_per_token(solutions.kv_bytes_per_token).passed
    assert ch06.check_mqa_saving(solutions.mqa_saving).passed
    assert ch06.check_users_that_fit(solutions.users_that_fit).passed
    assert ch06.check_generate_with_cache(solutions.generate_with_cache).passed
    assert ch06.check_cache_update(solutions.update).passed


def test_formula_mistakes_get_specific_hints():
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: l * h * d * b)
    assert not v and "K and V" in v.message
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: 2 * h * d * b)
    assert not v and "layers" in v.message
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: None)
    assert not v and "return" in v.message
    not_yet(ch06.check_kv_bytes_per_token(unattempted), "not attempted")


def test_wrong_numbers_get_hints():
    assert "number" in ch06.check_mqa_saving(None).message
    assert "head_dim" in ch06.check_mqa_saving(32).message
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
