"""Automatic checks for the notebooks' short exercises.

A check is a plain function decorated with @exercise. It receives the learner's answer
(a value, or a function to call) and calls expect(condition, hint) for each thing it checks.
What comes back is a Verdict that notebooks show as a green or red line:

    >>> from llm_anatomy.exercises import ch00
    >>> ch00.check_eos_token("<|im_end|>", tokenizer)
    Correct! ...

The check never raises: a learner's NotImplementedError means "not attempted yet", any
other exception in the learner's code becomes a red verdict that names it. This keeps every
notebook runnable top to bottom, with the exercises still open.
Each chapter's checks live in chNN.py beside this file; solutions live in workshop/solutions.

Hints come one at a time, so that a learner who is stuck gets a nudge before the answer:

    @exercise
    @hints("a nudge", "the key idea", "an outline of the code")
    def check_train(train): ...

    ch01.hint(ch01.check_train)     # shows hint 1 of 3; run it again for the next one

Where the method is the lesson, a check forbids the shortcut while it calls the learner's code:
`with forbidden(torch, "softmax", "compute the softmax from exp and sum"): call(answer, ...)`.
"""

from __future__ import annotations

import contextlib
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
            return Verdict(False, "not attempted: replace `raise NotImplementedError` with your code, "
                                  "then run this cell again.", check.__name__)
        except Exception as err:  # the learner's code failed: say how, without a traceback
            return Verdict(False, f"your code raised {type(err).__name__}: {err}", check.__name__)
        return Verdict(True, message or "well done.", check.__name__)

    wrapper.is_exercise_check = True
    return wrapper


def hints(*texts: str):
    """Attach hints to a check, from a nudge to an outline; `hint(check)` reveals them one at a time."""
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError("hints(...) needs one or more non-empty texts")

    def attach(check):
        check.hints = texts
        return check

    return attach


_revealed: dict[str, int] = {}  # check name -> how many hints the learner has seen


class Hint:
    """The hints revealed so far for one exercise (shown as a numbered list)."""

    def __init__(self, name: str, shown: tuple[str, ...], total: int):
        self.name, self.shown, self.total = name, shown, total

    def __str__(self) -> str:
        lines = [f"Hint {i} of {self.total}: {text}" for i, text in enumerate(self.shown, 1)]
        if len(self.shown) == self.total:
            lines.append("That was the last hint; the solution is in workshop/solutions.")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(t)}</li>" for t in self.shown)
        more = ("(that was the last hint; the solution is in workshop/solutions)" if len(self.shown) == self.total
                else f"(run it again for hint {len(self.shown) + 1} of {self.total})")
        return (f'<div style="border-left:4px solid #8a5a00;padding:4px 8px"><b>Hints</b><ol>{items}</ol>'
                f'<span style="color:#555">{more}</span></div>')


def hint(check) -> Hint:
    """Reveal the next hint of an exercise's check (all of them once they are used up)."""
    texts = getattr(check, "hints", None) or getattr(getattr(check, "__wrapped__", None), "hints", None)
    if not texts:
        raise ValueError(f"{getattr(check, '__name__', check)!r} has no hints")
    name = check.__name__
    _revealed[name] = min(_revealed.get(name, 0) + 1, len(texts))
    return Hint(name, tuple(texts[:_revealed[name]]), len(texts))


def reset_hints() -> None:
    """Forget which hints were shown (tests use it)."""
    _revealed.clear()


@contextlib.contextmanager
def forbidden(owner, name: str, why: str):
    """While the learner's code runs, calling `owner.name` stops the check with `why` (the method is the lesson)."""
    original = getattr(owner, name)

    def refuse(*args, **kwargs):
        raise NotYet(f"don't call {getattr(owner, '__name__', owner)}.{name} here: {why}")

    setattr(owner, name, refuse)
    try:
        yield
    finally:
        setattr(owner, name, original)


def call(answer, *args, **kwargs):
    """Call the learner's function (or return a plain value as it is)."""
    return answer(*args, **kwargs) if callable(answer) else answer
