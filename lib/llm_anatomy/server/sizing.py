"""How many requests a server may keep waiting: the queue limit sized from a TTFT objective (`--max-waiting auto`).

A request that joins the queue behind `q` others gets a batch slot after q + 1 admissions (theirs and its own), so at
the measured service rate mu (admissions per second) it waits W = (q + 1) / mu, and then its own prefill comes. That is
the expected wait if every admission took the mean time, not a bound (an admission slower than the mean makes it
longer); nor is it Little's law (L = lambda x W, which relates long-run averages, not one request's wait). A request
admitted while fewer than `limit` wait has at most limit - 1 ahead of it, so it is expected to wait about limit / mu;
the largest limit that still fits the objective is

    limit = floor((ttft_objective - prefill) / seconds_per_admission)

and a request beyond it is better refused at once (429 with Retry-After) than admitted to a TTFT past the objective.
The objective is given (`--ttft-objective-ms`), or by default OBJECTIVE_FACTOR x the shortest prefill the server has
timed lately (arrival at a slot to the first token, the least loaded it has been): "within 3x of the unloaded TTFT",
an optimistic prefill under load (the shortest one, not a loaded one).
The two measured figures move with the load, so the limit is recomputed at every admission decision; a service rate
measured while arrivals were slow (or after an idle spell) is low, which only makes the limit smaller.
"""

from __future__ import annotations

import math
from collections import deque

from ..errors import CourseError

OBJECTIVE_FACTOR = 3.0  # the default TTFT objective: this many times the shortest recent prefill


def _check_seconds(name: str, value, *, zero_ok: bool) -> None:
    """Raise a CourseError unless `value` is a finite number of seconds, > 0 (or >= 0 when zero_ok)."""
    low_ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value >= 0 if zero_ok else value > 0)
    if not (low_ok and value < math.inf):
        raise CourseError(f"{name} must be a finite number of seconds {'>=' if zero_ok else '>'} 0, not {value!r}.")


def queue_limit(ttft_objective_s: float, prefill_s: float, seconds_per_admission: float) -> int:
    """The most requests that may wait for a slot so that the last one admitted still has its first token within
    ttft_objective_s (seconds): floor((objective - prefill) / seconds_per_admission), at least 0 (0: queue nobody,
    take a request only when a slot is free for it)."""
    _check_seconds("ttft_objective_s", ttft_objective_s, zero_ok=True)
    _check_seconds("prefill_s", prefill_s, zero_ok=True)
    _check_seconds("seconds_per_admission", seconds_per_admission, zero_ok=False)
    return max(0, math.floor((ttft_objective_s - prefill_s) / seconds_per_admission + 1e-9))


def check_max_waiting(limit) -> None:
    """Raise a CourseError unless limit is None (no limit), a whole number >= 0, or "auto" (server/sizing.py)."""
    if limit is not None and limit != "auto" and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise CourseError(f"max_waiting must be None (no limit), a whole number >= 0 or \"auto\", not {limit!r}.")


class QueueSizer:
    """The engine's `--max-waiting auto`: remembers recent prefill times and sizes the limit from them.

    ttft_objective_s: the objective in seconds, or None for OBJECTIVE_FACTOR x the shortest recent prefill."""

    def __init__(self, ttft_objective_s: float | None = None, keep: int = 32):
        if ttft_objective_s is not None:
            _check_seconds("The TTFT objective (or None)", ttft_objective_s, zero_ok=False)
        self.ttft_objective_s = ttft_objective_s
        self.prefills: deque[float] = deque(maxlen=keep)  # seconds from a slot to the first token, recent requests

    def prefilled(self, seconds: float) -> None:
        """Note one request's time from its admission to its first token (seconds)."""
        if seconds >= 0:
            self.prefills.append(seconds)

    def objective_s(self) -> float | None:
        """The TTFT objective in force (seconds), None until a prefill has been timed when none was given."""
        if self.ttft_objective_s is not None:
            return self.ttft_objective_s
        return OBJECTIVE_FACTOR * min(self.prefills) if self.prefills else None

    def limit(self, seconds_per_admission: float) -> int:
        """The queue limit now (0 until the server has timed a prefill: nothing to size it from yet)."""
        objective = self.objective_s()
        if objective is None:
            return 0
        return queue_limit(objective, min(self.prefills) if self.prefills else 0.0, seconds_per_admission)
