"""Every `chNN.hint(chNN.check_...)` that a notebook offers (a commented line to uncomment, or in its text) works."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from llm_anatomy.exercises import Hint, reset_hints

ROOT = Path(__file__).resolve().parents[2]
HINT_CALL = re.compile(r"\b(ch\d\d)\.hint\((ch\d\d)\.(check_\w+)\)")


def _hint_lines():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for module, owner, check in HINT_CALL.findall(cell.source):
                yield pytest.param(module, owner, check, id=f"{path.stem}:{cell.cell_type}:{check}")


HINTS = list(_hint_lines())


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
