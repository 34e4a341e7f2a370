"""The course's continuous-batching scheduler (serve/scheduler.py) as the server runs it: on the wall clock.

A token's time is when it came out of its step on the server's clock, so that a request's engine TTFT holds the
scheduler's own bookkeeping as well as its model calls (engine.py sets the clock before every step). A request's
presence and frequency penalties (the API's fields) act on its logits before the scheduler chooses its token.
"""

from __future__ import annotations

from ..generate.penalties import Penalties
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
        self.penalties: dict[int, Penalties] = {}  # request id -> its penalties, for the requests that set any

    def emit(self, request: Request, token: int) -> None:
        self.now = max(self.now, self.clock())
        super().emit(request, token)

    def choose(self, request: Request, logits) -> int:
        """The scheduler's choice from the logits `[vocab]` after the request's penalties (generate/penalties.py,
        as GenerationSession applies them: repetition on the prompt and the output, presence and frequency on the
        output only), so its logprobs are those of the penalized logits, as the tokens were drawn from them."""
        penalties = self.penalties.get(request.id)
        if penalties is not None:
            logits = penalties.apply(logits, request.prompt, request.output)
        return super().choose(request, logits)
