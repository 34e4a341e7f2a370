"""Automatic checks for the notebooks' short exercises.

A check is a plain function decorated with @exercise. It receives the learner's answer
(a value, or a function to call) and calls expect(condition, hint) for each thing it checks.
What comes back is a Verdict that notebooks show as a green or red line:

    >>> from llm_anatomy.exercises import ch00
    >>> ch00.check_parameter_count(135)
    Correct! ...

The check never raises: a learner's NotImplementedError means "not attempted yet", any
other exception in the learner's code becomes a red verdict that names it. This keeps every
notebook runnable top to bottom, with the exercises still open.
Each chapter's checks live in chNN.py beside this file; solutions live in workshop/solutions.
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass


class NotYet(Exception):
    """Raised by expect(): the answer is not right yet; the message is the hint."""


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str
    name: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "Correct!" if self.passed else "Not yet:"
        return f"{mark} {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour, mark = ("#1b7f3b", "&#10004; Correct!") if self.passed else ("#b00020", "&#10008; Not yet:")
        return (f'<div style="border-left:4px solid {colour};padding:4px 8px;color:{colour}">'
                f"<b>{mark}</b> {html.escape(self.message)}</div>")


def expect(condition: bool, hint: str) -> None:
    """Stop the check with `hint` when `condition` is false."""
    if not condition:
        raise NotYet(hint)


def exercise(check):
    """Turn a check function into one that always returns a Verdict and never raises."""

    @functools.wraps(check)
    def wrapper(*args, **kwargs) -> Verdict:
        try:
            message = check(*args, **kwargs)
        except NotYet as hint:
            return Verdict(False, str(hint), check.__name__)
        except NotImplementedError:
            return Verdict(False, "not attempted yet: replace `raise NotImplementedError` with your code, "
                                  "then run this cell again.", check.__name__)
        except Exception as err:  # the learner's code failed: say how, without a traceback
            return Verdict(False, f"your code raised {type(err).__name__}: {err}", check.__name__)
        return Verdict(True, message or "well done.", check.__name__)

    wrapper.is_exercise_check = True
    return wrapper


def call(answer, *args, **kwargs):
    """Call the learner's function (or return a plain value as it is)."""
    return answer(*args, **kwargs) if callable(answer) else answer
