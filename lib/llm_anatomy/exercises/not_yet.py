"""What a check raises on its way to a red line: NotYet (the answer is not right yet, and the message says what to
change) and _LearnerFailed (the learner's own code raised). A module of their own, so that the guard (_guard.py)
raises NotYet without importing the package that imports the guard."""

from __future__ import annotations


class NotYet(Exception):
    """Raised by expect(): the answer is not right yet; the message says what to change."""


class _LearnerFailed(Exception):
    """The learner's own code raised (`call` wraps it, so that a check's stumbles read differently)."""
