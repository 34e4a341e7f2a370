"""What an engine step gives back, and the scheduler's numbers (vLLM's outputs.py and its scheduler stats).

`ContinuousScheduler.step()` returns one `RequestOutput` per request the step touched: what a server turns into events
(text, the end of an answer, an error), so that it never reads the scheduler's queues. `stats()` gives the
`SchedulerStats` that the server's metrics, the serving view and the widget read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .batching import Request


@dataclass
class RequestOutput:
    """What one step did for one request (vLLM's RequestOutput, one step's worth).

    new_tokens: the tokens it produced in this step (none while its prompt is still being prefilled);
    finished/finish_reason: "stop" (a stop token), "length" (max tokens) or "error" (its step failed: `error` says
    why); admitted: it joined the batch in this step; preempted: its blocks were taken back (it waits again).
    """

    request: Request
    new_tokens: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    admitted: bool = False
    preempted: bool = False
    error: str | None = None


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state in numbers, read by the server's metrics, its views and the widget (`stats()`)."""

    steps: int  # iterations run
    now_s: float  # its clock
    running: int  # requests holding a batch slot
    waiting: int  # requests queued
    finished: int  # requests retired (all time, not only the kept log)
    preemptions: int  # admissions ended to make room (all time)
    blocks_total: int
    blocks_free: int  # in no request and no prefix cache
    blocks_cached: int  # held only by the prefix cache (evictable)
    prefix_query_tokens: int  # prompt tokens looked up in the prefix cache (0 without one)
    prefix_hit_tokens: int  # of them, found

    @property
    def blocks_used(self) -> int:
        """Blocks that running requests hold."""
        return self.blocks_total - self.blocks_free - self.blocks_cached
