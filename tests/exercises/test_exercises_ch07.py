"""Notebook 07's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import pytest
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch07
from llm_anatomy.measure.roofline import forward_work
from llm_anatomy.weights.random import RANDOM_SHAPES

solutions = load_solutions("ch07")
SMOL = ch07._config(RANDOM_SHAPES["135m"])  # SmolLM2-135M's shape


def test_solutions_pass():
    assert ch07.check_decode_work(solutions.decode_work).passed
    for ridge, size in ((6.0, 4), (150.0, 2), (25.0, 2)):
        answer = solutions.ridge_batch(ridge, size)
        assert ch07.check_ridge_batch(answer, SMOL, 16, size, ridge).passed, (ridge, size)
    assert ch07.check_predict_step(solutions.predict_step_s).passed


def test_ridge_batch_is_where_forward_work_crosses_the_ridge():
    b = ch07.ridge_batch(SMOL, 16, 4, 6.0)
    assert forward_work(SMOL, 1, 16, b, 4).intensity >= 6.0 > forward_work(SMOL, 1, 16, b - 1, 4).intensity
    assert ch07.ridge_batch(SMOL, 100_000, 2, 500.0) is None  # long contexts: the cache keeps intensity down
    assert "no batch" in ch07.check_ridge_batch(10, SMOL, 100_000, 2, 500.0).message


def _variant(**drop):
    """decode_work with one typical mistake."""
    def work(cfg, past, size):
        L, H, K, d = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h, q, kv_width = cfg.hidden_size, H * d, K * d
        block = L * (h * q + 2 * h * kv_width + q * h + 3 * h * cfg.intermediate_size)  # by hand: the check refuses
        head, n = cfg.vocab_size * cfg.hidden_size, past + (0 if drop.get("past_only") else 1)
        flops_per_weight = 1 if drop.get("one_flop") else 2
        flops = flops_per_weight * block + (0 if drop.get("no_head") else flops_per_weight * head)
        flops += 0 if drop.get("no_attention") else 4 * L * H * d * n / (2 if drop.get("one_flop") else 1)
        kv = 0 if drop.get("no_kv") else 2 * L * (H if drop.get("heads") else K) * d * size * n
        kv /= 2 if drop.get("only_k") else 1
        weights = block + (2 if drop.get("embedding_too") else 1) * head
        return flops, weights * size + kv
    return work


@pytest.mark.parametrize("mistake, words", [
    ("one_flop", "2 FLOPs"), ("no_head", "LM head"), ("no_attention", "attention's own FLOPs"),
    ("no_kv", "KV cache"), ("only_k", "multiply by 2"), ("heads", "kv_heads"), ("embedding_too", "one row"),
    ("past_only", "past + 1 positions"),
])
def test_decode_work_mistakes(mistake, words):
    not_yet(ch07.check_decode_work(_variant(**{mistake: True})), words)


def test_other_wrong_answers_get_hints():
    not_yet(ch07.check_decode_work(lambda cfg, past, size: 1.0), "two things", "(flops, bytes)")
    not_yet(ch07.check_decode_work(unattempted), "not attempted")
    right = ch07.ridge_batch(SMOL, 16, 4, 6.0)
    not_yet(ch07.check_ridge_batch(2 * right, SMOL, 16, 4, 6.0), "twice too big")
    not_yet(ch07.check_ridge_batch(right / 2, SMOL, 16, 4, 6.0), "half")
    not_yet(ch07.check_ridge_batch(None, SMOL, 16, 4, 6.0), "prediction")
    not_yet(ch07.check_ridge_batch(0.5, SMOL, 16, 4, 6.0), "at least one")
    not_yet(ch07.check_ridge_batch(10 * right, SMOL, 16, 4, 6.0), "off")


def test_step_bounds_solution_and_mistakes():
    assert ch07.check_step_bounds(solutions.step_bounds).passed

    def with_bounds(**change):
        def step_bounds(flops, moved, ops, peak, bandwidth, per_op):
            bounds = {"compute": flops / peak, "memory": moved / bandwidth, "overhead": ops * per_op}
            bounds.update({key: make(flops, moved, ops, peak, bandwidth, per_op) for key, make in change.items()})
            return bounds, max(bounds, key=bounds.get)
        return step_bounds

    not_yet(ch07.check_step_bounds(with_bounds(compute=lambda f, m, o, p, b, c: f * p)), "multiplied")
    not_yet(ch07.check_step_bounds(with_bounds(memory=lambda f, m, o, p, b, c: m / p)), "by the bandwidth")
    not_yet(ch07.check_step_bounds(with_bounds(overhead=lambda f, m, o, p, b, c: o / c)), "ops x seconds per op")

    def smallest(*args):
        bounds, _ = solutions.step_bounds(*args)
        return bounds, min(bounds, key=bounds.get)

    not_yet(ch07.check_step_bounds(smallest), "LARGEST")
    not_yet(ch07.check_step_bounds(lambda *args: solutions.step_bounds(*args)[0]), "two things")
    not_yet(ch07.check_step_bounds(unattempted), "not attempted")


def test_predict_step_mistakes_are_named_and_the_library_is_refused():
    def memory(b, c, w, kv, n, bw):
        return (w + b * c * kv) / bw

    cases = {
        "its OWN cache": lambda b, c, w, kv, n, bw, fl: max((w + c * kv) / bw, 2 * b * n / fl),
        "once per step for the whole": lambda b, c, w, kv, n, bw, fl: max(b * (w + c * kv) / bw, 2 * b * n / fl),
        "not their sum": lambda b, c, w, kv, n, bw, fl: memory(b, c, w, kv, n, bw) + 2 * b * n / fl,
        "2 FLOPs per token": lambda b, c, w, kv, n, bw, fl: max(memory(b, c, w, kv, n, bw), b * n / fl),
        "by the batch": lambda b, c, w, kv, n, bw, fl: max(memory(b, c, w, kv, n, bw), 2 * n / fl),
        "left out the arithmetic": lambda b, c, w, kv, n, bw, fl: memory(b, c, w, kv, n, bw),
        "left out the KV cache": lambda b, c, w, kv, n, bw, fl: max(w / bw, 2 * b * n / fl),
        "LARGER of the two": lambda b, c, w, kv, n, bw, fl: min(memory(b, c, w, kv, n, bw), 2 * b * n / fl),
    }
    for words, wrong in cases.items():
        not_yet(ch07.check_predict_step(wrong), words)
    from llm_anatomy.measure.roofline import predict_decode_step_s

    not_yet(ch07.check_predict_step(predict_decode_step_s), "don't call", "predict_decode_step_s")
    not_yet(ch07.check_predict_step(lambda *a: 1.0), "the floor is")
    not_yet(ch07.check_predict_step(unattempted), "not attempted")
