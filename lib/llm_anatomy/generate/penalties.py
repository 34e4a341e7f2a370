"""Penalties that push the model away from what it already wrote, applied to the logits before sampling.

- repetition (CTRL's, transformers' `repetition_penalty`): every token already seen has its logit divided by
  the penalty when positive and multiplied by it when negative, so it becomes less likely either way; 1.0 is off;
- presence and frequency (the OpenAI API's `presence_penalty` and `frequency_penalty`, -2 .. 2): subtract
  presence once from every token seen at least once, and frequency once per time it was seen; 0 is off.

Which ids count is the caller's choice; vLLM counts the prompt and the output for the repetition penalty and only
the output for presence and frequency, and so do `Penalties.apply` and `GenerationSession`. Engines apply these before temperature
and the filters (generate/sampling.py), as transformers does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import CourseError


def check_penalties(repetition: float = 1.0, presence: float = 0.0, frequency: float = 0.0) -> None:
    """Raise a CourseError with a clear sentence if a penalty is out of range."""
    for name, value in (("repetition_penalty", repetition), ("presence_penalty", presence),
                        ("frequency_penalty", frequency)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise CourseError(f"{name} must be a number, not {value!r}.")
    if not 0 < repetition < math.inf:
        raise CourseError(f"repetition_penalty must be a finite number > 0 (1.0 is off), not {repetition}.")
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not -2 <= value <= 2:
            raise CourseError(f"{name} must be between -2 and 2 (0 is off), as in the OpenAI API, not {value}.")


def apply_penalties(logits: torch.Tensor, seen: Sequence[int], *, repetition: float = 1.0,
                    presence: float = 0.0, frequency: float = 0.0) -> torch.Tensor:
    """The logits `[vocab]` with the penalties applied for the token ids in `seen` (a new float32 tensor).

    With no penalty set, the logits come back unchanged in value.
    """
    check_penalties(repetition, presence, frequency)
    if logits.dim() != 1:
        raise CourseError(f"apply_penalties takes one row of logits [vocab], not a tensor of shape "
                          f"{tuple(logits.shape)}.")
    out = logits.float().clone()
    if not len(seen):
        return out
    ids = torch.as_tensor(list(seen), dtype=torch.long, device=logits.device)
    if int(ids.min()) < 0 or int(ids.max()) >= out.shape[0]:
        raise CourseError(f"A seen token id is outside the vocabulary of {out.shape[0]}.")
    counts = torch.bincount(ids, minlength=out.shape[0]).to(out.dtype)  # [vocab], times each token was seen
    if repetition != 1.0:
        hit = counts > 0
        out = torch.where(hit & (out > 0), out / repetition, torch.where(hit, out * repetition, out))
    return out - presence * (counts > 0).to(out.dtype) - frequency * counts


@dataclass(frozen=True)
class Penalties:
    """The three penalties as one setting (all off by default), validated when made; `apply` uses vLLM's counting:
    the prompt and the output for the repetition penalty, the output only for presence and frequency."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    def __post_init__(self):
        check_penalties(self.repetition, self.presence, self.frequency)

    @property
    def active(self) -> bool:
        return (self.repetition, self.presence, self.frequency) != (1.0, 0.0, 0.0)

    def describe(self) -> str:
        parts = [f"{name} {value:g}" for name, value, off in (("repetition", self.repetition, 1.0),
                 ("presence", self.presence, 0.0), ("frequency", self.frequency, 0.0)) if value != off]
        return ", ".join(parts) or "no penalties"

    def apply(self, logits: torch.Tensor, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
        """The logits `[vocab]` (float32) with the penalties applied; the same values when none is set."""
        if not self.active:
            return logits.float()
        out = apply_penalties(logits, list(prompt) + list(output), repetition=self.repetition)
        return apply_penalties(out, output, presence=self.presence, frequency=self.frequency)
