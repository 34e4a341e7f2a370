"""Notebook 06's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

from exercise_helpers import load_solutions

from llm_anatomy.exercises import ch06

solutions = load_solutions("ch06")


def test_solutions_pass():
    assert ch06.check_kv_bytes_per_token(solutions.kv_bytes_per_token).passed
    assert ch06.check_mqa_saving(solutions.mqa_saving).passed
    assert ch06.check_users_that_fit(solutions.users_that_fit).passed


def test_formula_mistakes_get_specific_hints():
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: l * h * d * b)
    assert not v and "K and V" in v.message
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: 2 * h * d * b)
    assert not v and "layers" in v.message
    v = ch06.check_kv_bytes_per_token(lambda l, h, d, b: None)
    assert not v and "return" in v.message

    def unanswered(l, h, d, b):
        raise NotImplementedError

    v = ch06.check_kv_bytes_per_token(unanswered)
    assert not v and "not attempted" in v.message


def test_wrong_numbers_get_hints():
    assert "number" in ch06.check_mqa_saving(None).message
    assert "head_dim" in ch06.check_mqa_saving(32).message
    assert "weights" in ch06.check_users_that_fit(74).message
    assert "round down" in ch06.check_users_that_fit(60).message
    assert "whole number" in ch06.check_users_that_fit(59.5).message
    assert not ch06.check_users_that_fit(None)
