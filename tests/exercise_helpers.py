"""Shared by the tests of the notebooks' exercise checks (tests/test_exercises_chNN.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_solutions(chapter: str):
    """The module workshop/solutions/<chapter>.py (kept out of the package, like out of the notebooks)."""
    spec = importlib.util.spec_from_file_location(f"solutions_{chapter}", ROOT / "workshop" / "solutions" / f"{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def not_yet(verdict, *words):
    """Assert that a verdict failed and that its hint mentions each of `words`."""
    assert not verdict.passed, verdict
    for word in words:
        assert word in verdict.message, verdict.message


def unattempted(*args, **kwargs):
    """A learner's function that has not been written yet."""
    raise NotImplementedError


def as_learner_code(function):
    """`function` (a check's own reference, computing a typical mistake) as if a notebook cell had defined it: the
    guard refuses the checks' own helpers to the learner's code, which a wrong answer built from them would be."""
    import types

    code = function.__code__.replace(co_filename="<notebook cell>")
    copy = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy
