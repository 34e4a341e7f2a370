"""Hints, for every exercise check of every chapter: three of them, from a nudge to an outline, revealed one at a
time; and every `chNN.hint(chNN.check_...)` that a notebook offers (a line to uncomment, or in its text) works."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from llm_anatomy.exercises import Hint, hint, reset_hints

ROOT = Path(__file__).resolve().parents[2]
HINT_CALL = re.compile(r"\b(ch\d\d)\.hint\((ch\d\d)\.(check_\w+)\)")


def _hint_lines():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for module, owner, check in HINT_CALL.findall(cell.source):
                yield pytest.param(module, owner, check, id=f"{path.stem}:{cell.cell_type}:{check}")


HINTS = list(_hint_lines())


EXERCISES = ROOT / "lib" / "llm_anatomy" / "exercises"
CHAPTER_FILE = re.compile(r"ch\d\d(_\w+)?\.py")  # ch04.py, and the modules a chapter imports its checks from (ch04_block.py)


def _checks():
    # every check once, in the module that defines it: chNN.py re-exports the checks of chNN_topic.py, which are
    # read from their own module so that none is skipped and none counted twice
    for path in sorted(EXERCISES.glob("ch*.py")):
        if not CHAPTER_FILE.fullmatch(path.name):
            continue
        module = importlib.import_module(f"llm_anatomy.exercises.{path.stem}")
        for name in sorted(vars(module)):
            check = getattr(module, name)
            if getattr(check, "is_exercise_check", False) and check.__module__ == module.__name__:
                yield pytest.param(check, id=f"{path.stem}.{name}")


CHECKS = list(_checks())


def test_every_chapter_has_checks():
    assert len(CHECKS) >= 30
    ids = [param.id for param in CHECKS]
    for topic in ("ch01_encoding.", "ch04_block."):  # checks defined outside chNN.py are checked too
        assert any(i.startswith(topic) for i in ids), topic
    assert len(ids) == len(set(ids)) and len({id(param.values[0]) for param in CHECKS}) == len(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_three_hints_from_a_nudge_to_an_outline_one_at_a_time(check):
    reset_hints()
    try:
        shown = [hint(check) for _ in range(4)]
        assert [len(h.shown) for h in shown] == [1, 2, 3, 3] and shown[0].total == 3
        nudge = shown[0].shown[0]
        # a nudge, not the code: no return, no definition, no assignment, no call, no indexing
        assert not re.search(r"\breturn\b|\bdef |=|\w\(|\w\[|\brange\b", nudge), nudge
        assert "last hint" in str(shown[-1]) and "solution" in str(shown[-1])
    finally:
        reset_hints()


def test_the_notebooks_offer_hints():
    assert len(HINTS) >= 25  # every build exercise of 01-09 has one


@pytest.mark.parametrize("module, owner, check", HINTS)
def test_an_uncommented_hint_line_reveals_the_hints_one_at_a_time(module, owner, check):
    assert module == owner, f"{module}.hint({owner}.{check}): the same chapter on both sides"
    chapter = importlib.import_module(f"llm_anatomy.exercises.{module}")
    reset_hints()
    try:
        first = chapter.hint(getattr(chapter, check))
        assert isinstance(first, Hint) and len(first.shown) == 1 and first.total >= 2
        assert len(chapter.hint(getattr(chapter, check)).shown) == 2
    finally:
        reset_hints()
