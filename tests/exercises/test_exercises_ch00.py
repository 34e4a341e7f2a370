"""Notebook 00's exercise checks: the solutions pass, typical wrong answers fail with a specific message."""

from __future__ import annotations

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch00

solutions = load_solutions("ch00")


def test_count_parameters_on_the_toy():
    assert ch00.check_count_parameters(solutions.count_parameters).passed
    twice = lambda m: sum(t.numel() for t in m.state_dict().values())  # noqa: E731  (the tied table twice)
    not_yet(ch00.check_count_parameters(twice), "twice", "tied")
    not_yet(ch00.check_count_parameters(lambda m: 135), "60 numbers")
    not_yet(ch00.check_count_parameters(lambda m: 60.5), "whole number")
    assert ch00.check_count_parameters(lambda m: 60.0).passed  # 60.0 is 60
    not_yet(ch00.check_count_parameters(lambda m: None), "return")
    not_yet(ch00.check_count_parameters(unattempted), "not attempted")
    not_yet(ch00.check_count_parameters(None), "define a function")


def test_count_parameters_on_the_real_model(real):
    verdict = ch00.check_count_parameters(solutions.count_parameters, real)
    assert verdict.passed and "134,515,008" in verdict.message, verdict.message


def test_eos_token(real):
    assert ch00.check_eos_token(solutions.eos_token(real.tokenizer), real.tokenizer).passed
    not_yet(ch00.check_eos_token("</s>", real.tokenizer), "closes every turn")
    not_yet(ch00.check_eos_token("<|im_start|>", real.tokenizer), "opens a turn")
    not_yet(ch00.check_eos_token(None, real.tokenizer), "string")
