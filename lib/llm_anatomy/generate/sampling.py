"""Choosing the next token from the model's logits: greedy, temperature, top-k, top-p (nucleus).

The model gives one score (logit) per vocabulary entry. Decoding turns them into one token id:
- greedy: the highest score, always;
- temperature T: divide the logits by T before the softmax (T < 1 sharpens, T > 1 flattens,
  T = 0 means greedy);
- top-k: keep only the k highest-scoring tokens (and any tied with the k-th);
- top-p (nucleus): keep the fewest most likely tokens whose probabilities add up to at least p;
- min-p: keep the tokens at least min_p times as likely as the most likely one (llama.cpp's and Ollama's
  default filter): a cut that follows the model's confidence, tight when one token dominates, loose when many tie.

They combine the way transformers' generate() chains its warpers: temperature, then top-k, then top-p,
then min-p, then sample (other engines chain them in other orders: llama.cpp applies the temperature after
its filters, so the same settings can give a different distribution there); the kept tokens and their probabilities are the same as transformers', ties and float32
rounding included. `next_token_probs` gives the filtered distribution (for plots and the stepper
widget); `sample_next` draws from it with a seeded `torch.Generator`, so a seed makes a run reproducible.
Both take logits `[vocab]` or `[batch, vocab]`, and refuse logits holding NaN or +inf, or a row where
every logit is -inf (single -inf entries are fine: they are masked tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import CourseError


@dataclass(frozen=True)
class SamplingSettings:
    """How to choose the next token. temperature 0 = greedy; top_k None = no top-k; top_p 1.0 = no top-p;
    min_p 0.0 = no min-p."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        check_settings(self.temperature, self.top_k, self.top_p, self.min_p)

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
        if self.min_p > 0.0:
            parts.append(f"min-p {self.min_p:g}")
        return ", ".join(parts)


def check_settings(temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                   min_p: float = 0.0) -> None:
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
    if isinstance(min_p, bool) or not isinstance(min_p, (int, float)):
        raise CourseError(f"min_p must be a number in [0, 1], not {type(min_p).__name__}.")
    if not 0 <= min_p <= 1:  # also refuses NaN
        raise CourseError(f"min_p must be in [0, 1] (0 keeps every token), not {min_p}.")


def _check_logits(logits: torch.Tensor) -> None:
    """Raise a CourseError if `logits` is not `[vocab]` or `[batch, vocab]`, or cannot give a distribution."""
    if not isinstance(logits, torch.Tensor):
        raise CourseError(f"logits must be a torch tensor, not {type(logits).__name__}.")
    if logits.dim() not in (1, 2):
        raise CourseError(f"logits must be [vocab] or [batch, vocab], not of shape {tuple(logits.shape)}.")
    _check_finite(logits)


def _check_finite(logits: torch.Tensor) -> None:
    """Refuse NaN, +inf, and rows that are all -inf; one isfinite pass when all is well."""
    finite = torch.isfinite(logits)
    if bool(finite.all()):
        return
    overflow = "the model's numbers overflowed, which happens in fp16 on some GPUs; run in bf16 or fp32."
    if bool(torch.isnan(logits).any()):
        raise CourseError(f"The logits hold NaN (not a number): {overflow}")
    if bool(torch.isposinf(logits).any()):
        raise CourseError(f"The logits hold +inf: {overflow}")
    # what is left is -inf, which marks a masked token; a row of nothing but masked tokens is refused
    if not bool(finite.any(dim=-1).all()):
        raise CourseError("Every logit is -inf: no token is allowed, so there is nothing to choose from; "
                          "check the mask that set them.")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The id of the highest logit: a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`.

    Refuses NaN, +inf and all -inf logits (CourseError), where argmax would give a meaningless id.
    """
    _check_finite(logits)
    return logits.argmax(dim=-1)


def _divide_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in float32: the scores transformers' TemperatureLogitsWarper gives.

    A tiny T can overflow float32 (80 / 1e-45 = inf, and then the softmax is NaN); the scores are
    then shifted so that the best one is 0 before dividing: the same distribution, and finite.
    """
    x = logits.float()
    scores = x / temperature
    if not bool(torch.isfinite(scores.amax(dim=-1)).all()):
        shifted = x - x.amax(dim=-1, keepdim=True)  # <= 0, and 0 for the best token
        # 0 stays 0 even on a device that divides as x * (1 / T), where 1 / T overflows to inf
        scores = torch.where(shifted == 0, 0.0, shifted / temperature)
    return scores


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """True for the tokens top-k keeps: those scoring at least the k-th highest score.

    Tokens tied with the k-th are all kept, so more than k can survive (transformers does the same).
    """
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores >= kth


def top_p_mask(scores: torch.Tensor, p: float) -> torch.Tensor:
    """True for the nucleus: the fewest most likely tokens whose probabilities add up to at least p.

    `scores` are logits or log-probabilities (only their softmax matters). It is computed from the other
    end, as transformers does: drop the least likely tokens while their probabilities add up to at most
    1 - p. When the kept tokens add up to p itself, float32 rounding decides: for p = 0.8 the dropped
    tail can sum to 0.19999999 (the token at the edge is dropped) or 0.20000002 (it is kept); doing
    transformers' arithmetic gives transformers' answer.
    The most likely token is always kept. Among tied tokens, torch.sort's order decides which goes first.
    """
    ascending, order = torch.sort(scores, dim=-1)  # least likely first, the same call as transformers
    tail_mass = torch.softmax(ascending, dim=-1).cumsum(dim=-1)  # this token and every less likely one
    drop = tail_mass <= 1 - p
    drop[..., -1] = False  # the most likely token stays
    return ~drop.scatter(-1, order, drop)  # each flag back at its token's position


def min_p_mask(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """True for the tokens min-p keeps: probability at least min_p x the most likely token's probability.

    The most likely token always passes (its ratio is 1), so at least one token survives any min_p <= 1.
    """
    probs = torch.softmax(scores, dim=-1)
    return probs >= min_p * probs.amax(dim=-1, keepdim=True)


def next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """The distribution the next token is drawn from, float32, same shape as `logits`.

    The steps of transformers' warpers: scores = logits / T; top-k and then top-p set the tokens they
    drop to -inf (top-p sees only what top-k kept, min-p what top-p kept); a softmax turns the rest into probabilities that sum
    to 1, and the dropped tokens get exactly 0. temperature 0 gives all the probability to the highest
    logit (greedy). Logits holding NaN or +inf, or a row that is all -inf, raise a CourseError.
    """
    check_settings(temperature, top_k, top_p, min_p)
    _check_logits(logits)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    scores = _divide_by_temperature(logits, temperature)
    if top_k is not None:
        scores = scores.masked_fill(~top_k_mask(scores, top_k), float("-inf"))
    if top_p < 1.0:
        scores = scores.masked_fill(~top_p_mask(scores, top_p), float("-inf"))
    if min_p > 0.0:
        scores = scores.masked_fill(~min_p_mask(scores, min_p), float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
                generator: torch.Generator | None = None, min_p: float = 0.0) -> torch.Tensor:
    """Draw the next token id(s): a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`.

    Greedy (temperature 0) draws nothing from `generator`; otherwise one draw per row. Bad settings or
    logits (NaN, +inf, all -inf) raise a CourseError before anything is drawn.
    """
    if temperature == 0:
        check_settings(temperature, top_k, top_p, min_p)
        _check_logits(logits)
        return logits.argmax(dim=-1)
    return draw(next_token_probs(logits, temperature, top_k, top_p, min_p), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id drawn from each distribution: a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`."""
    rows = probs if probs.dim() == 2 else probs.unsqueeze(0)
    ids = torch.multinomial(rows, 1, generator=generator).squeeze(-1)
    return ids if probs.dim() == 2 else ids[0]


def sample_with(logits: torch.Tensor, settings: SamplingSettings,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_next with a SamplingSettings: the drawn id(s) and the distribution they came from (computed once)."""
    probs = next_token_probs(logits, settings.temperature, settings.top_k, settings.top_p,  # checks the logits
                             settings.min_p)
    ids = logits.argmax(dim=-1) if settings.temperature == 0 else draw(probs, generator)
    return ids, probs


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded with `seed`: the same seed gives the same draws."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CourseError(f"seed must be a whole number, not {seed!r}.")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def token_logprobs(logits: torch.Tensor, chosen: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """The natural-log probability of `chosen` under the model's own distribution (softmax of the raw logits
    `[vocab]`, before temperature and filters, as the OpenAI API and vLLM report it), and the `top` most likely
    (id, logprob) pairs, most likely first."""
    _check_logits(logits)
    logp = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logp, top) if top > 0 else None
    pairs = [] if best is None else [(int(i), float(v)) for v, i in zip(best.values, best.indices)]
    return float(logp[chosen]), pairs

