"""What one step of generation shows: the token chosen, its candidates, the cache after it (session.py makes them).

A `StepResult` holds everything a view draws of one step (views/stepper.py, the stepper widget), so that a view
needs no model: the token and its probability, the most likely candidates with their probabilities before and
after the sampling filters, the cache's size, the time, and optionally one head's attention row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .sampling import SamplingParams


@dataclass(frozen=True)
class Candidate:
    """One possible next token: its id, text, probability after sampling filters, and raw probability (T=1)."""

    token_id: int
    text: str
    prob: float
    raw_prob: float
    allowed: bool = True  # False: a grammar's mask removed it (notebook 12); raw_prob is still the model's own


@dataclass
class StepResult:
    """One generated token and the evidence around it.

    index: 0 for the token chosen by prefill, then 1, 2, ...
    fed_tokens: how many tokens this call ran through the model (prompt length for prefill, else 1)
    candidates: the `top_n` most likely tokens at temperature 1, best first, each with its probability
        after the filters (0 when temperature/top-k/top-p cut it); the chosen one is always among them,
        added at the end if it ranks lower
    cache_tokens / cache_bytes: positions and bytes of K and V in the cache after this call
    cache_capacity_tokens / cache_capacity_bytes: what the preallocated cache holds at most
    ms: wall time of this call in milliseconds (model + sampling)
    attention: for `attention=(layer, head)`, the attention weights `[positions]` of the token fed
        last over every position so far (None otherwise)
    """

    index: int
    token_id: int
    text: str
    prob: float
    candidates: list[Candidate]
    fed_tokens: int
    cache_tokens: int
    cache_bytes: int
    cache_capacity_tokens: int
    cache_capacity_bytes: int
    ms: float
    params: SamplingParams  # how this token was chosen (the session's params at the time)
    finished: bool = False
    stop_reason: str | None = None  # "eos" (stops.finish_reason's "stop": a stop token) or "length" once finished
    attention: torch.Tensor | None = None
    resampled: bool = False
    allowed_tokens: int | None = None  # with a grammar (the session's constraint): how many tokens it allowed here

    @property
    def chosen_rank(self) -> int:
        """0 for the most likely candidate."""
        return next(i for i, c in enumerate(self.candidates) if c.token_id == self.token_id)


def top_candidates(logits: torch.Tensor, probs: torch.Tensor, token: int, top_n: int,
                   token_texts: Callable[[list[int]], list[str]],
                   allowed: torch.Tensor | None = None) -> list[Candidate]:
    """The `top_n` most likely tokens at temperature 1, best first, each with its probability after the filters
    (`probs`) and its raw one; the chosen `token` is added at the end when it ranks lower.

    logits, probs: `[vocab]`. Ranked by the raw probability: the filters keep that order, and the learner sees what
    they cut. allowed: a grammar's mask `[vocab]` (bool), or None; with one, `logits` are the model's own (unmasked),
    each candidate says whether the grammar kept it, and the most likely kept tokens are added after the top_n, so
    that what the grammar removed shows beside what it kept.
    """
    raw = torch.softmax(logits, dim=-1)
    top = torch.topk(raw, min(top_n, raw.numel())).indices.tolist()
    if allowed is not None:
        kept = raw.masked_fill(~allowed, -1.0)
        top += [i for i in torch.topk(kept, min(top_n // 2, int(allowed.sum()))).indices.tolist() if i not in top]
    if token not in top:
        top.append(token)
    return [Candidate(i, t, float(probs[i]), float(raw[i]), allowed is None or bool(allowed[i]))
            for i, t in zip(top, token_texts(top))]
