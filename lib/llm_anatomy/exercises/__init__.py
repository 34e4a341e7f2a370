"""Automatic checks for the notebooks' exercises: chNN.py holds a chapter's checks, workshop/solutions its answers.

A check is a plain function decorated with @exercise. It receives the learner's answer (a value, or a function
to call), calls it through `call`, and calls expect(condition, message) for each thing it checks. What comes
back is a claims.Verdict that the notebook shows as a green or red line:

    >>> ch00.check_eos_token("<|im_end|>", tokenizer)
    Correct! ...

A check never raises. A learner's NotImplementedError means "not attempted yet"; an exception in the learner's
code (anything `call` ran) becomes a red line that names it; anything else a check stumbles on becomes a red
line that asks for what the exercise wants. Every notebook stays runnable top to bottom with the exercises open.

The tools a check is built from:

* `returned(value, kind, what)`: the learner's result as the kind the check compares, or a red line that says
  what to return ("return a number (the loss), not None"). Near-miss types are accepted where they mean the same:
  kinds "number" (int, float, NumPy scalar, one-element tensor -> float), "whole" (also 65.0 from `//` on floats,
  np.int64 -> int), "id" (a token id: int, NumPy or tensor integer, never a float -> int), "ids" (a list, tuple
  or tensor of ids, flattened -> list[int]), "id set" (-> set[int]), "tensor" (a tensor, NumPy array or list ->
  torch.Tensor), "text" (-> str), "pair" and "triple" (a tuple or list of 2 or 3 things -> tuple).
* `forbidden(owner, "name", why)` and `forbidden_all(targets, why)`: where the method is the lesson, refuse the
  library's shortcut while the learner's code runs. A target is an (owner, "name") pair (a module or class and
  one attribute; an owner of None is skipped, for a module that may not be imported) or the callable itself.
  The refusal is alias-proof: it is the function object that is refused, however it was reached, `from x import
  f`, a name bound by an earlier cell, a default argument, a dict, a closure, `functools.partial`; a method
  whatever the instance (`ours.chunks(...)`), or a C method reached from an instance (`x.softmax(-1)` for
  (torch.Tensor, "softmax")); a class, by every method it defines. Three watches do it: the owner's attribute
  is replaced by a refusal for the duration, sys.setprofile sees every call of the refused objects from Python
  code, and for torch targets a TorchFunctionMode sees them even when C code calls them. The learner's code
  cannot swallow a refusal: a check that saw one refuses when the block ends. `when=` narrows the refusal to the
  calls whose arguments (a dict of the Python target's parameters) it accepts:

      with forbidden_all([(torch.nn.functional, "scaled_dot_product_attention"), attention.attention], "write the
                         scores, the mask and the softmax yourself"):
          out = call(attend, q.clone(), k.clone(), v.clone())

  The learner sees "don't call torch.nn.functional.scaled_dot_product_attention here: write the scores, ...". A
  refused object is refused wherever it is called while the guard is open, inside library code the learner calls
  too (a shortcut through another library function is a shortcut), so open the guard around the learner's call
  only and compute the reference outside it. Limits: a C function that C code calls is seen only for torch
  targets; a compiled class (tokenizers' Rust types) is watched, not replaced; `when=` targets are watched, not
  replaced.

  Hand the learner copies of anything the notebook keeps using (tensors cloned, dicts and lists copied), so that
  code which mutates its arguments cannot break a later cell.

A check, then, reads like this (tests/exercises/test_wrong_answers.py holds every typical mistake and shortcut,
each shown refused with the message that names it; the chapter's test file runs the solution):

    @exercise
    @hints("a nudge", "the key idea", "the outline")
    def check_one_head(attend) -> str:
        expect(callable(attend), "define a function attend(q, k, v).")
        for q, k, v in unseen_inputs():
            with forbidden_all(shortcuts, "write the scores, the mask and the softmax yourself"):
                out = returned(call(attend, q.clone(), k.clone(), v.clone()), "tensor", "the head's output")
            expect(out.shape == q.shape, f"return [seq, head_dim], not {list(out.shape)}.")
            if not close(out, reference(q, k, v)):
                for change, message in TYPICAL_MISTAKES:  # what each mistake computes, and its name
                    expect(not close(out, reference(q, k, v, **change)), message)
                expect(False, "the generic steps, as a last resort")
        return "what the learner has now shown"
* `hints(...)` and `hint(check)`: hints revealed one at a time, a nudge first, the outline last:

      @exercise
      @hints("a nudge (no code)", "the key idea", "an outline of the code")
      def check_train(train): ...

      # ch01.hint(ch01.check_train)  # uncomment for a hint; run again for the next one
"""

from __future__ import annotations

import functools
import html
import inspect
import math
import numbers
import sys
import types

from ..claims import GREEN, RED, Verdict
from ._guard import forbidden, forbidden_all
from .not_yet import NotYet, _LearnerFailed

__all__ = ["NotYet", "Verdict", "call", "exercise", "expect", "forbidden", "forbidden_all", "hint", "hints",
           "reset_hints", "returned"]


def expect(condition: bool, message: str) -> None:
    """Stop the check with `message` when `condition` is false."""
    if not condition:
        raise NotYet(message)


def call(answer, *args, **kwargs):
    """Call the learner's function (a plain value comes back as it is); what its code raises is reported as such."""
    if not callable(answer):
        return answer
    try:
        return answer(*args, **kwargs)
    except (NotYet, NotImplementedError, _LearnerFailed):
        raise
    except Exception as err:
        raise _LearnerFailed(err) from err


def exercise(check):
    """Turn a check function into one that always returns a Verdict and never raises."""

    @functools.wraps(check)
    def wrapper(*args, **kwargs) -> Verdict:
        name = check.__name__
        try:
            message = check(*args, **kwargs)
        except NotYet as why:
            return Verdict("Not yet:", str(why), RED, False, name)
        except NotImplementedError:
            return Verdict("Not yet:", "not attempted: replace `raise NotImplementedError` with your code, then run "
                                       "this cell again.", RED, False, name)
        except _LearnerFailed as failed:  # the learner's code failed: say how, without a traceback
            err = failed.args[0]
            return Verdict("Not yet:", f"your code raised {type(err).__name__}: {err}", RED, False, name)
        except Exception as err:  # the check could not use the answer: say what it wants
            return Verdict("Not yet:", f"this check could not use your answer ({type(err).__name__}: {err}): give "
                                       "what the exercise's text asks for, of the kind it names.", RED, False, name)
        return Verdict("Correct!", message or "well done.", GREEN, True, name)

    wrapper.is_exercise_check = True
    return wrapper


# ---------------------------------------------------------------------------------------------- returned values

def _described(value) -> str:
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {list(value.shape)}"
    if isinstance(value, (tuple, list, set, dict)) and len(repr(value)) >= 40:
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) < 40 else text[:37] + '...'}"


def _one_number(value):
    """A Python number from a number, a NumPy scalar or a one-element tensor or array; None if it is none of them."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Number):
        return value.item() if hasattr(value, "item") else value
    if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:
        return value.item()
    if hasattr(value, "size") and hasattr(value, "item") and getattr(value, "size", 0) == 1:
        return value.item()
    return None


def returned(value, kind: str, what: str = "your answer"):
    """`value` (what the learner's code gave) as `kind`, or NotYet saying what to return instead. `what` names the
    expected thing in the message ("the loss", "the new ids"). Kinds: see this module's docstring."""
    if value is None:
        raise NotYet(f"you gave None for {what}: end your function with `return ...` (or assign the answer).")
    if kind in ("number", "whole", "id"):
        number = _one_number(value)
        wanted = {"number": "a number", "whole": "a whole number", "id": "an int"}[kind]
        expect(number is not None and not isinstance(number, complex), f"give {what} as {wanted}, not "
                                                                        f"{_described(value)}.")
        expect(math.isfinite(number), f"{what} is {number}, not a finite number.")
        if kind == "number":
            return float(number)
        if kind == "id":
            expect(isinstance(number, int), f"a token id is an int, not the float {number!r}: use int(...).")
        expect(float(number).is_integer(), f"{what} must be a whole number, not {number!r}.")
        return int(number)
    if kind in ("ids", "id set"):
        if hasattr(value, "tolist") and hasattr(value, "shape"):
            value = value.reshape(-1).tolist() if hasattr(value, "reshape") else value.tolist()
        sets_ok = kind == "id set" and isinstance(value, (set, frozenset))
        expect(isinstance(value, (list, tuple)) or sets_ok,
               f"return {what} as a {'set' if kind == 'id set' else 'list'} of ints, not {_described(value)}.")
        ids = [returned(i, "id", f"each of {what}") for i in value]
        return set(ids) if kind == "id set" else ids
    if kind == "tensor":
        import numpy as np
        import torch

        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            raise NotYet(f"return {what} as one tensor, not a {type(value).__name__} of {len(value)} tensors: "
                         "torch.stack(...) them, or build it with one operation.")
        try:
            if isinstance(value, (str, bytes, dict, set)):
                raise TypeError(type(value).__name__)
            array = np.asarray(value)  # a list of ints stays ints (ids), of floats floats
            if array.dtype.kind not in "biuf":
                raise TypeError(array.dtype)
            return torch.as_tensor(array.astype(np.float64) if array.dtype.kind == "f" else array)
        except (TypeError, ValueError):
            raise NotYet(f"return {what} as a tensor (or an array of numbers), not {_described(value)}.") from None
    if kind == "text":
        expect(isinstance(value, str), f"give {what} as a string, not {_described(value)}.")
        return value
    if kind in ("pair", "triple"):
        size = 2 if kind == "pair" else 3
        expect(isinstance(value, (tuple, list)) and len(value) == size,
               f"return {('two', 'three')[size - 2]} things as a tuple, {what}; not {_described(value)}.")
        return tuple(value)
    raise ValueError(f"returned(): unknown kind {kind!r}")


# ---------------------------------------------------------------------------------------------- hints

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

