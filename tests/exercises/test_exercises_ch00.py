"""Notebook 00's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

from exercise_helpers import load_solutions

from llm_anatomy.exercises import ch00

solutions = load_solutions("ch00")


def test_chapter_00_parameter_count():
    assert ch00.check_parameter_count(135).passed
    assert "millions" in ch00.check_parameter_count(134_515_008).message
    assert "off" in ch00.check_parameter_count(100).message
    assert "number" in ch00.check_parameter_count("135").message
    assert not ch00.check_parameter_count(None).passed


def test_chapter_00_eos_token(real):
    assert ch00.check_eos_token("<|im_end|>", real.tokenizer).passed
    assert not ch00.check_eos_token("</s>", real.tokenizer).passed


def test_chapter_00_solutions_pass(real):
    assert ch00.check_parameter_count(round(solutions.parameter_count_millions(real)), real).passed
    assert ch00.check_eos_token(solutions.eos_token(real.tokenizer), real.tokenizer).passed
