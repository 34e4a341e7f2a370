"""Notebook 04's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import torch

from exercise_helpers import load_solutions, not_yet as _not_yet, unattempted as _unattempted

from llm_anatomy.exercises import ch04

solutions = load_solutions("ch04")


def test_rms_norm():
    assert ch04.check_rms_norm(solutions.rms_norm).passed
    _not_yet(ch04.check_rms_norm(lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)), "weight")
    _not_yet(ch04.check_rms_norm(lambda x, w, eps: x / x.std(-1, keepdim=True) * w), "rsqrt")
    _not_yet(ch04.check_rms_norm(_unattempted), "not attempted")


def test_swiglu():
    assert ch04.check_swiglu(solutions.swiglu).passed
    silu = torch.nn.functional.silu
    _not_yet(ch04.check_swiglu(lambda x, g, u, d: (silu(x @ u.T) * (x @ g.T)) @ d.T), "gate projection")
    _not_yet(ch04.check_swiglu(lambda x, g, u, d: (silu(x @ g.T) + (x @ u.T)) @ d.T), "(a * b)")
    _not_yet(ch04.check_swiglu(lambda x, g, u, d: silu(x @ g.T)), "[tokens, hidden]")


def test_next_token_on_a_tiny_model():
    from tiny_models import tiny_llama

    from llm_anatomy.scratch import ScratchLlama

    class Tokenizer:  # ids as text, enough for the check
        def encode(self, text):
            return [ord(c) % 128 for c in text]

        def decode(self, ids):
            return f"<{ids[0]}>"

    model, tok = ScratchLlama.from_hf(tiny_llama()), Tokenizer()
    right = solutions.next_token(model, tok)
    assert ch04.check_next_token(right, model, tok).passed
    _not_yet(ch04.check_next_token("<999>", model, tok), "argmax")
    _not_yet(ch04.check_next_token(None, model, tok), "assign")
    _not_yet(ch04.check_next_token(5, model, tok), "string")


def test_next_token_on_the_real_model(real):
    from llm_anatomy.scratch import ScratchLlama

    model = ScratchLlama.from_hf(real.model)
    answer = solutions.next_token(model, real.tokenizer)
    assert ch04.check_next_token(answer, model, real.tokenizer).passed
    assert answer == " Paris"
    _not_yet(ch04.check_next_token("Paris", model, real.tokenizer), "leading space")
