"""Notebook 01's exercise checks: the solutions pass, typical wrong answers fail with a helpful hint."""

from __future__ import annotations

import pytest

from exercise_helpers import load_solutions

from llm_anatomy.exercises import ch01

solutions = load_solutions("ch01")


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    from llm_anatomy.models import fetch_default_model

    return AutoTokenizer.from_pretrained(fetch_default_model())


def test_merge_solution_passes():
    verdict = ch01.check_merge(solutions.merge)
    assert verdict.passed, verdict.message


def test_merge_solution_agrees_with_the_library():
    from llm_anatomy.bpe import merge

    for ids, pair in [([1, 1, 1, 2, 1, 1], (1, 1)), ([3, 4, 3, 4, 3], (4, 3)), ([], (1, 2))]:
        assert solutions.merge(ids, pair, 50) == merge(ids, pair, 50)


def test_merge_wrong_answers_get_hints():
    def overlapping(ids, pair, new_id):  # forgets to skip the second id of a merged pair
        out = []
        for i, x in enumerate(ids):
            if i + 1 < len(ids) and (x, ids[i + 1]) == pair:
                out.append(new_id)
            elif not (i > 0 and (ids[i - 1], x) == pair):
                out.append(x)
        return out

    def misses_the_end(ids, pair, new_id):
        out, i = [], 0
        while i < len(ids) - 1:
            if (ids[i], ids[i + 1]) == pair:
                out.append(new_id)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out + ids[i:] if i == len(ids) - 1 else out

    def in_place(ids, pair, new_id):
        result = solutions.merge(ids, pair, new_id)
        ids[:] = result
        return result

    def not_attempted(ids, pair, new_id):
        raise NotImplementedError

    assert "[8, 7]" in ch01.check_merge(overlapping).message
    assert "a new one" in ch01.check_merge(in_place).message
    assert "not attempted" in ch01.check_merge(not_attempted).message
    assert "function" in ch01.check_merge(None).message
    assert "list" in ch01.check_merge(lambda ids, pair, new_id: tuple(ids)).message
    assert ch01.check_merge(misses_the_end).passed  # a correct variant passes too


@pytest.mark.integration
def test_token_count(reference):
    answer = solutions.token_count(reference, ch01.COUNT_TEXT)
    assert ch01.check_token_count(answer, reference).passed
    assert "words" in ch01.check_token_count(len(ch01.COUNT_TEXT.split()), reference).message
    assert "characters" in ch01.check_token_count(len(ch01.COUNT_TEXT), reference).message
    assert "Hint" in ch01.check_token_count(answer + 1, reference).message
    assert "whole number" in ch01.check_token_count("9", reference).message
    assert not ch01.check_token_count(None, reference).passed


@pytest.mark.integration
def test_number_tokens(reference):
    answer = solutions.number_tokens(reference, ch01.NUMBER)
    assert answer == len(ch01.NUMBER)  # one token per digit in SmolLM2
    assert ch01.check_number_tokens(answer, reference).passed
    assert not ch01.check_number_tokens(2, reference).passed
    assert not ch01.check_number_tokens(None, reference).passed
