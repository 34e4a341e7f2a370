"""Notebook 07's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

from exercise_helpers import load_solutions

from llm_anatomy.exercises import ch07

solutions = load_solutions("ch07")


def test_solutions_pass():
    assert ch07.check_decode_gflop(solutions.decode_gflop(134.5e6)).passed
    assert ch07.check_decode_gflop(solutions.decode_gflop(1.2e9), parameters=1.2e9).passed
    assert ch07.check_bound(solutions.bound(0.5, 20.0), 0.5, 20.0).passed
    assert ch07.check_bound(solutions.bound(300.0, 20.0), 300.0, 20.0).passed
    assert ch07.check_decode_ceiling(solutions.decode_ceiling(5.4e8, 1.2e10), 5.4e8, 1.2e10).passed


def test_wrong_answers_get_hints():
    assert "multiply AND an add" in ch07.check_decode_gflop(0.1345).message
    assert "GFLOP" in ch07.check_decode_gflop(2.69e8).message
    assert "off" in ch07.check_decode_gflop(1.0).message
    assert not ch07.check_decode_gflop(None)
    assert "ridge" in ch07.check_bound("compute", 0.5, 20.0).message
    assert "'memory' or 'compute'" in ch07.check_bound("bandwidth", 0.5, 20.0).message
    assert "upside down" in ch07.check_decode_ceiling(5.4e8 / 1.2e10, 5.4e8, 1.2e10).message
    assert "off" in ch07.check_decode_ceiling(100.0, 5.4e8, 1.2e10).message
    assert not ch07.check_decode_ceiling(None, 5.4e8, 1.2e10)
