"""The course's continuous-batching scheduler (serve/scheduler.py) as the server runs it: on the wall clock.

A token's time is when it came out of its step on the server's clock, so that a request's engine TTFT holds the
scheduler's own bookkeeping as well as its model calls (engine.py sets the clock before every step).
"""

from __future__ import annotations

from ..serve.batching import Request
from ..serve.scheduler import ContinuousScheduler


class WallClockScheduler(ContinuousScheduler):
    """The course's scheduler on a server's wall clock: a token's time is when it came out of its step.

    clock(): seconds on the engine's clock. The scheduler's own clock advances by its model calls only (notebook 08);
    here it is also moved on to the wall clock as each token comes out, so the time spent between the calls
    (admitting, planning the blocks, choosing the tokens) is in the request's times too."""

    def __init__(self, *args, clock, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = clock

    def emit(self, request: Request, token: int) -> None:
        self.now = max(self.now, self.clock())
        super().emit(request, token)
