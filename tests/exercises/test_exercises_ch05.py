"""Notebook 05's checks: the solutions pass, typical mistakes get a helpful hint."""

from __future__ import annotations

import torch
from exercise_helpers import load_solutions

from llm_anatomy.exercises import ch05

solutions = load_solutions("ch05")


def test_the_solutions_pass():
    for verdict in (ch05.check_greedy_choice(solutions.greedy_choice),
                    ch05.check_temperature(solutions.apply_temperature),
                    ch05.check_top_k(solutions.keep_top_k)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    def todo(*args):
        raise NotImplementedError

    for check in (ch05.check_greedy_choice, ch05.check_temperature, ch05.check_top_k):
        verdict = check(todo)
        assert not verdict.passed and "not attempted yet" in verdict.message
    assert "define" in ch05.check_greedy_choice(None).message


def test_greedy_mistakes():
    assert "LEAST likely" in ch05.check_greedy_choice(lambda l: int(l.argmin())).message
    assert "most likely token is" in ch05.check_greedy_choice(lambda l: 0).message
    assert "an int" in ch05.check_greedy_choice(lambda l: "1").message
    assert ch05.check_greedy_choice(lambda l: l.argmax()).passed  # a 0-d tensor is fine


def test_temperature_mistakes():
    assert "divide" in ch05.check_temperature(lambda l, t: torch.softmax(l * t, -1)).message
    assert "softmax" in ch05.check_temperature(lambda l, t: l / t).message
    assert "expected" in ch05.check_temperature(lambda l, t: torch.softmax(l, -1)).message
    assert "tensor" in ch05.check_temperature(lambda l, t: [0.25] * 4).message


def test_top_k_mistakes():
    assert "LEAST likely" in ch05.check_top_k(lambda l, k: set(torch.topk(-l, k).indices.tolist())).message
    assert "exactly" in ch05.check_top_k(lambda l, k: {1}).message
    assert "keeps" in ch05.check_top_k(lambda l, k: set(range(k))).message
    assert ch05.check_top_k(lambda l, k: torch.topk(l, k).indices).passed
