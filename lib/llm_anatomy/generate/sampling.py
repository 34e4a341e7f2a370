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
widget); `sample_next(logits, params, generator)`, the one sampler every loop calls, applies a `SamplingParams`'
penalties, filters and draws with a seeded `torch.Generator`, so a seed makes a run reproducible.
Both take logits `[vocab]` or `[batch, vocab]`, and refuse logits holding NaN or +inf, or a row where
every logit is -inf (single -inf entries are fine: they are masked tokens).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import CourseError
from .penalties import Penalties, check_penalties


@dataclass(frozen=True)
class SamplingParams:
    """How one generation picks its tokens and when it stops: vLLM's SamplingParams, with its names.

    temperature 0 = greedy; top_k None = no top-k; top_p 1.0 = no top-p; min_p 0.0 = no min-p;
    repetition_penalty 1.0, presence_penalty 0.0, frequency_penalty 0.0 = no penalty (penalties.py);
    seed: the generator's seed; top_logprobs: record each token's logprob and this many alternatives (None: none);
    max_tokens: at most this many new tokens; stop_token_ids: stop after any of these ids (stops.finish_reason);
    stop: stop strings, cut from the text (stops.StopMatcher). Lists given for the last two become tuples.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    top_logprobs: int | None = None
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        check_settings(self.temperature, self.top_k, self.top_p, self.min_p)
        check_penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise CourseError(f"seed must be a whole number, not {self.seed!r}.")
        top = self.top_logprobs
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
            raise CourseError(f"top_logprobs must be None or a whole number >= 0, not {top!r}.")
        n = self.max_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CourseError(f"max_tokens must be a whole number, at least 1, not {n!r}.")
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise CourseError(f"stop_token_ids must be a list of token ids (whole numbers >= 0), not {ids!r}.")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in ids))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise CourseError(f"stop must be a list of non-empty strings, not {self.stop!r}.")
        object.__setattr__(self, "stop", tuple(stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalties(self) -> Penalties | None:
        """The three penalties as a Penalties, or None when all are off (nothing to apply)."""
        penalties = Penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty)
        return penalties if penalties.active else None

    def describe(self) -> str:
        """The choice in words: "greedy", or the temperature and each filter on; then the penalties that are on."""
        if self.greedy:
            parts = ["greedy"]
        else:
            parts = [f"temperature {self.temperature:g}"]
            if self.top_k is not None:
                parts.append(f"top-k {self.top_k}")
            if self.top_p < 1.0:
                parts.append(f"top-p {self.top_p:g}")
            if self.min_p > 0.0:
                parts.append(f"min-p {self.min_p:g}")
        if self.penalties is not None:
            parts.append(self.penalties.describe())
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


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None, *,
                prompt: Sequence[int] | None = None, output: Sequence[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's one sampler: the next token id(s) by `params`, and the distribution they came from.

    logits `[vocab]` (ids: a 0-d tensor) or `[batch, vocab]` (ids: `[batch]`). First the penalties, when params has
    any, on the ids already seen (vLLM's counting: `prompt` and `output` for repetition, `output` for presence and
    frequency; one row of logits); then the filter chain (next_token_probs); then the draw: greedy (temperature 0)
    takes the highest and draws nothing from `generator`, otherwise one draw per row. Bad logits (NaN, +inf, all
    -inf) raise a CourseError before anything is drawn.
    """
    if not isinstance(params, SamplingParams):
        raise CourseError(f"params must be a SamplingParams(temperature=..., top_k=...), not {params!r}.")
    penalties = params.penalties
    if penalties is not None:
        if prompt is None and output is None:
            raise CourseError(f"The params have penalties ({penalties.describe()}): pass the prompt and output ids "
                              "they count.")
        if logits.dim() != 1:
            raise CourseError(f"Penalties count the ids of one sequence: give one row of logits [vocab], not "
                              f"{tuple(logits.shape)}.")
        logits = penalties.apply(logits, prompt or [], output or [])
    if params.greedy:  # the highest logit, and all the probability on it (next_token_probs' one-hot), made cheaply:
        if not isinstance(logits, torch.Tensor) or logits.dim() not in (1, 2):
            _check_logits(logits)  # refuses it in its words
        ids = logits.argmax(dim=-1)
        chosen = ids.unsqueeze(-1)
        # argmax lands on a NaN or +inf when there is one, and on -inf only when the whole row is: checking the chosen
        # logits refuses what _check_logits refuses, without a pass over the vocabulary
        if not bool(torch.isfinite(logits.gather(-1, chosen)).all()):
            _check_finite(logits)
        return ids, torch.zeros(logits.shape, device=logits.device).scatter_(-1, chosen, 1.0)
    probs = next_token_probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)  # checks logits
    return draw(probs, generator), probs


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id drawn from each distribution: a 0-d tensor for `[vocab]`, `[batch]` for `[batch, vocab]`."""
    rows = probs if probs.dim() == 2 else probs.unsqueeze(0)
    ids = torch.multinomial(rows, 1, generator=generator).squeeze(-1)
    return ids if probs.dim() == 2 else ids[0]


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded with `seed`: the same seed gives the same draws."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CourseError(f"seed must be a whole number, not {seed!r}.")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


GREEDY = SamplingParams(temperature=0.0)  # notebook 08's requests, speculative decoding's default


def token_logprobs(logits: torch.Tensor, chosen: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """The natural-log probability of `chosen` under the model's own distribution (softmax of the raw logits
    `[vocab]`, before temperature and filters, as the OpenAI API and vLLM report it), and the `top` most likely
    (id, logprob) pairs, most likely first."""
    _check_logits(logits)
    logp = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logp, top) if top > 0 else None
    pairs = [] if best is None else [(int(i), float(v)) for v, i in zip(best.values, best.indices)]
    return float(logp[chosen]), pairs

