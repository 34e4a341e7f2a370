"""Choosing the next token from the model's logits: greedy, temperature, top-k, top-p (nucleus).

The model gives one score (logit) per vocabulary entry. Decoding turns them into one token id:
- greedy: the highest score, always;
- temperature T: divide the logits by T before the softmax (T < 1 sharpens, T > 1 flattens,
  T = 0 means greedy);
- top-k: keep only the k highest-scoring tokens;
- top-p (nucleus): keep the smallest set of most likely tokens whose probabilities add up to p.

They combine in the order transformers uses: temperature, then top-k, then top-p, then sample.
`next_token_probs` gives the filtered distribution (for plots and the stepper widget);
`sample_next` draws from it with a seeded `torch.Generator`, so a seed makes a run reproducible.
Both take logits `[vocab]` or `[batch, vocab]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import CourseError


@dataclass(frozen=True)
class SamplingSettings:
    """How to choose the next token. temperature 0 = greedy; top_k None = no top-k; top_p 1.0 = no top-p."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self):
        check_settings(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p {self.top_p:g}")
        return ", ".join(parts)


def check_settings(temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0) -> None:
    """Raise a CourseError with a clear sentence if a sampling setting is out of range."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise CourseError(f"temperature must be a number (0 for greedy), not {type(temperature).__name__}.")
    if math.isnan(temperature) or math.isinf(temperature) or temperature < 0:
        raise CourseError(f"temperature must be a finite number >= 0 (0 means greedy), not {temperature}.")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise CourseError(f"top_k must be a whole number >= 1 (or None for no top-k), not {top_k!r}.")
        if top_k < 1:
            raise CourseError(f"top_k must be >= 1 (or None for no top-k), not {top_k}.")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise CourseError(f"top_p must be a number in (0, 1], not {type(top_p).__name__}.")
    if not 0 < top_p <= 1:  # also refuses NaN
        raise CourseError(f"top_p must be in (0, 1] (1 keeps every token), not {top_p}.")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The id of the highest logit: a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`."""
    return logits.argmax(dim=-1)


def scale_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-probabilities of softmax(logits / T), in float32, safe for tiny T (no overflow, no NaN).

    Subtracting the maximum first keeps every scaled value <= 0, so even T = 1e-30 gives a finite
    result (the best token 0, the rest -inf). T = 0 is not allowed here; callers treat it as greedy.
    """
    x = logits.float()
    x = (x - x.max(dim=-1, keepdim=True).values) / temperature
    return torch.log_softmax(x, dim=-1)


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """True for the tokens top-k keeps: those scoring at least the k-th highest score (ties kept)."""
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores >= kth


def top_p_mask(log_probs: torch.Tensor, p: float) -> torch.Tensor:
    """True for the nucleus: the fewest most likely tokens whose probabilities sum to at least p.

    A token is kept when the probability of the tokens ranked above it is still below p; the most
    likely token is always kept.
    """
    sorted_lp, order = torch.sort(log_probs, dim=-1, descending=True)
    probs = sorted_lp.exp()
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
    keep_sorted = before < p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float = 1.0) -> torch.Tensor:
    """The distribution the next token is drawn from, float32, same shape as `logits`.

    Tokens filtered out by top-k or top-p get probability 0; the rest are renormalised to sum to 1.
    temperature 0 gives all the probability to the highest logit (greedy).
    """
    check_settings(temperature, top_k, top_p)
    if logits.dim() not in (1, 2):
        raise CourseError(f"logits must be [vocab] or [batch, vocab], not of shape {tuple(logits.shape)}.")
    if temperature == 0:
        return torch.nn.functional.one_hot(greedy(logits), logits.shape[-1]).float()
    log_probs = scale_by_temperature(logits, temperature)
    keep = torch.ones_like(log_probs, dtype=torch.bool)
    if top_k is not None:
        keep &= top_k_mask(log_probs, top_k)
    if top_p < 1.0:
        # top-p sees the distribution after top-k, as in transformers
        log_probs = torch.log_softmax(log_probs.masked_fill(~keep, float("-inf")), dim=-1)
        keep &= top_p_mask(log_probs, top_p)
    return torch.softmax(log_probs.masked_fill(~keep, float("-inf")), dim=-1)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw the next token id(s): a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`.

    Greedy (temperature 0) draws nothing from `generator`; otherwise one draw per row.
    """
    if temperature == 0:
        check_settings(temperature, top_k, top_p)
        return greedy(logits)
    return draw(next_token_probs(logits, temperature, top_k, top_p), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id drawn from each distribution: a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`."""
    rows = probs if probs.dim() == 2 else probs.unsqueeze(0)
    ids = torch.multinomial(rows, 1, generator=generator).squeeze(-1)
    return ids if probs.dim() == 2 else ids[0]


def sample_with(logits: torch.Tensor, settings: SamplingSettings,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_next with a SamplingSettings: the drawn id(s) and the distribution they came from (computed once)."""
    probs = next_token_probs(logits, settings.temperature, settings.top_k, settings.top_p)
    ids = greedy(logits) if settings.temperature == 0 else draw(probs, generator)
    return ids, probs


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded with `seed`: the same seed gives the same draws."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CourseError(f"seed must be a whole number, not {seed!r}.")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
