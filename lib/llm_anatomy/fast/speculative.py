"""Speculative decoding: guess several tokens cheaply, check them all in one pass of the model (claim C18).

Decode is memory-bound: one token costs one read of every weight, and a pass over k + 1 tokens costs
little more, because the weights are read once for all of them. So let something cheap draft k tokens,
then run the model once over the last token and the k drafts. Position i of that pass says what the
model itself would have chosen after draft i - 1:

- greedy: keep the drafts while each equals the model's own choice; at the first that differs, take the
  model's token instead. Every round gives at least one token, and the output is exactly plain greedy
  decoding's (to float rounding of the wider pass): a wrong draft costs time, never correctness.
- sampling (Leviathan et al. 2023, Chen et al. 2023): accept a draft x with probability min(1, p(x) / q(x)),
  where p is the model's distribution and q the draft's; on rejection, sample from max(p - q, 0),
  normalised. The tokens that come out are distributed exactly as p, whatever q is.

Drafts that need no second model: `PromptLookupDraft` copies what followed the latest earlier match of the
last few tokens (texts that quote their input: edits, summaries, code); `LayerSkipDraft` runs the model with
some of its layers left out. Both keep the interface draft(context, k, params, generator) -> (tokens, q or None).

The verify pass is a `prefill` (generate/decode.py) that keeps the logits of every position it feeds, so a pass that
fails leaves the cache as it was; every token is chosen by generate/sampling.py's `sample_next` with one
`SamplingParams`, the course's one sampler (so top-k, top-p, min-p and the penalties work here too: p and q are then
the penalized, filtered distributions, and the rule keeps p exactly).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..device import timed
from ..errors import CourseError
from ..generate.decode import decode_step, prefill
from ..generate.sampling import GREEDY, SamplingParams, greedy, next_token_probs, sample_next, seeded_generator

# --------------------------------------------------------------------------- drafts


class PromptLookupDraft:
    """Propose the k tokens that followed the latest earlier occurrence of the context's last n tokens.

    n goes from `max_ngram` down to `min_ngram`; no match: no draft (the round is a plain decode step).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise CourseError(f"Use 1 <= min_ngram <= max_ngram, not {min_ngram} and {max_ngram}.")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def draft(self, context: list[int], k: int, params: SamplingParams | None = None, generator=None):
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # latest match first, never the tail itself
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k], None  # q is one-hot: the draft is certain
        return [], None

    def rollback(self, valid: int) -> None:
        """Nothing to undo: the draft keeps no state."""


class LayerSkipDraft:
    """The model itself with only the layers in `keep`: cheaper per token, often right on easy tokens.

    Keeping the first n layers is an early exit (the logit lens of notebook 04 as a draft). It keeps its own
    KV cache, since its residual stream, and so its keys and values, differ from the full model's.
    """

    def __init__(self, model, keep, max_len: int | None = None):
        keep = sorted(set(int(i) for i in keep))
        if not keep or keep[0] < 0 or keep[-1] >= model.cfg.num_layers:
            raise CourseError(f"keep must name layers from 0 to {model.cfg.num_layers - 1}, not {keep}.")
        with torch.device("meta"):  # a skeleton whose parts are the model's own modules (shared, not copied)
            self.model = type(model)(dataclasses.replace(model.cfg, num_layers=0))
        self.model.cfg = model.cfg  # the cache keeps every layer's slot; the skipped ones stay empty
        self.model.embed_tokens, self.model.norm, self.model.lm_head = model.embed_tokens, model.norm, model.lm_head
        self.model.layers = nn.ModuleList(model.layers[i] for i in keep)
        self.keep, self.max_len, self.cache = keep, max_len, None

    def draft(self, context: list[int], k: int, params: SamplingParams | None = None, generator=None):
        """k tokens drawn by `params` (its penalties left out: q only has to be what the draft drew from), and q."""
        params = _without_penalties(params or GREEDY)
        if self.cache is None or self.cache.max_len < len(context) + k:
            self.cache = self.model.new_cache(1, max(self.max_len or 0, 2 * (len(context) + k)))
        device = self.model.device
        out = prefill(self.model, torch.tensor([context[self.cache.length:]], device=device), self.cache)  # catch up
        tokens, probs = [], []
        for i in range(k):
            token, q = _choose(out.logits[0, -1], params, generator)
            tokens.append(token)
            probs.append(q)
            if i < k - 1:
                out = decode_step(self.model, torch.tensor([[token]], device=device), self.cache)
        return tokens, (None if params.greedy else torch.stack(probs))

    def rollback(self, valid: int) -> None:
        """Forget cached positions from `valid` on (drafts that the model rejected)."""
        if self.cache is not None:
            self.cache.length = min(self.cache.length, valid)


def _choose(logits: torch.Tensor, params: SamplingParams, generator=None, *, prompt=None,
            output=None) -> tuple[int, torch.Tensor | None]:
    """The next token from logits [vocab] by the course's sampler (penalties counted on `prompt` and `output`), and
    the distribution it came from (None when greedy: the choice is certain)."""
    token, probs = sample_next(logits, params, generator, prompt=prompt, output=output)
    return int(token), (None if params.greedy else probs)


def _without_penalties(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)


# --------------------------------------------------------------------------- the rule


def accept_or_resample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator=None):
    """Leviathan/Chen's rule: (accepted [n] bool, tokens [n]) for draft tokens `drafts` [n] drawn from q.

    p, q: the model's and the draft's distributions [vocab] (q one-hot for a certain draft). A draft x is kept
    with probability min(1, p(x) / q(x)); otherwise the token is drawn from max(p - q, 0), normalised. Either
    way, the token is distributed as p.
    """
    if p.shape != q.shape or p.dim() != 1:
        raise CourseError(f"p and q must be distributions of one shape [vocab], not {tuple(p.shape)}, {tuple(q.shape)}.")
    p, q = p.double(), q.double()
    u = torch.rand(drafts.shape, generator=generator, dtype=torch.float64, device=p.device)
    accepted = u * q[drafts] < p[drafts]  # u < p/q without dividing by a q(x) of 0
    residual = (p - q).clamp(min=0)
    residual = residual / residual.sum() if residual.sum() > 0 else p  # p == q: never rejected anyway
    resampled = torch.multinomial(residual, drafts.numel(), replacement=True, generator=generator).view(drafts.shape)
    return accepted, torch.where(accepted, drafts, resampled)


# --------------------------------------------------------------------------- the loop


@dataclass
class SpeculativeResult:
    """What a speculative generation gives back: the tokens and how the drafts fared."""

    tokens: list[int]
    rounds: int = 0  # passes of the model after the prefill (one per round)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens kept
    rejections: int = 0  # rounds that stopped at a rejected draft
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)  # the width of each verify pass is 1 + this
    drafts_per_round: list[list[int]] = field(default_factory=list)  # the drafted tokens themselves, kept or not
    rounds_without_draft: int = 0  # rounds with room for drafts in which the draft proposed none (no match)
    prefill_s: float = 0.0  # wall time of the prefill and the first token, seconds
    seconds: float = 0.0  # wall time of the whole generation, prefill included

    @property
    def acceptance_rate(self) -> float:
        """P(a draft token is kept | those before it were): kept / (kept + rejected). 0 when nothing was drafted."""
        examined = self.accepted + self.rejections
        return self.accepted / examined if examined else 0.0

    @property
    def tokens_per_round(self) -> float:
        """New tokens per pass of the model after the prefill (plain decoding: 1); the prefill makes the first."""
        return (len(self.tokens) - 1) / self.rounds if self.rounds else 1.0


@torch.inference_mode()
def speculative_generate(model, prompt_ids: torch.Tensor, new_tokens: int, draft, k: int = 4, *,
                         params: SamplingParams = GREEDY, generator=None,
                         eos_token_id: int | None = None) -> SpeculativeResult:
    """Generate `new_tokens` for one prompt [1, seq]: draft k tokens, verify them in one pass, keep the good ones.

    params (a SamplingParams): greedy (temperature 0, the default) gives the same tokens as plain greedy decoding;
    above 0, samples from the distribution generate/sampling.py's sample_next makes (the penalties on the prompt and
    the tokens so far, then temperature, top-k, top-p, min-p) with the accept-or-resample rule; the draws come from
    `generator`, or from one seeded with params.seed. It makes `new_tokens` tokens (params.max_tokens is not read) and
    stops after `eos_token_id` or one of params.stop_token_ids. Stop strings and logprobs are refused: this loop keeps
    no text and records no logprobs.
    """
    if not isinstance(params, SamplingParams):
        raise CourseError(f"params must be a SamplingParams(temperature=..., top_k=...), not {params!r}.")
    if params.stop or params.top_logprobs is not None:
        raise CourseError("Speculative decoding here stops on token ids and records no logprobs: give params without "
                          "stop strings and top_logprobs (a server's StopMatcher cuts stop strings from the text).")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CourseError(f"The draft length k must be a whole number, at least 1, not {k!r}.")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise CourseError(f"new_tokens must be a whole number, at least 1, not {new_tokens!r}.")
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1:
        raise CourseError(f"Speculative decoding here runs one sequence: prompt_ids [1, seq], not {tuple(prompt_ids.shape)}.")
    context = getattr(getattr(model, "cfg", None), "max_position_embeddings", None)
    if context is not None and prompt_ids.shape[1] + new_tokens > context:
        raise CourseError(f"The prompt's {prompt_ids.shape[1]} tokens and {new_tokens} new ones pass the model's context "
                          f"of {context} positions: ask for at most {max(context - prompt_ids.shape[1], 0)} new tokens.")
    if generator is None and not params.greedy:
        generator = seeded_generator(params.seed, prompt_ids.device)
    stops = set(params.stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
    seconds, result = timed(lambda: _generate(model, prompt_ids, new_tokens, draft, k, params, generator, stops),
                            prompt_ids.device)
    result.seconds = seconds
    return result


def _generate(model, prompt_ids, new_tokens, draft, k, params, generator, stops) -> SpeculativeResult:
    """speculative_generate's loop, its arguments checked."""
    context = prompt_ids[0].tolist()
    cache = model.new_cache(1, len(context) + new_tokens + 1)
    prefill_s, first = timed(lambda: _choose(prefill(model, prompt_ids, cache).logits[0, -1], params, generator,
                                             prompt=context, output=[])[0], prompt_ids.device)
    result = SpeculativeResult([first], prefill_s=prefill_s)
    draft.rollback(0)  # a new sequence: nothing the draft cached for an earlier one is valid
    while len(result.tokens) < new_tokens and result.tokens[-1] not in stops:
        room = new_tokens - len(result.tokens) - 1  # the round's own token always comes on top of the drafts
        seen = context + result.tokens
        drafts, q = draft.draft(seen, min(k, room), params, generator) if room else ([], None)
        if len(drafts) > min(k, room):  # the pass, the cache and q are sized for at most k drafts
            raise CourseError(f"The draft proposed {len(drafts)} tokens when asked for at most {min(k, room)}: "
                              "a draft's draft(context, k, ...) must return k tokens or fewer.")
        before = cache.length
        ids = torch.tensor([[result.tokens[-1]] + drafts], device=prompt_ids.device)  # [1, 1 + drafts]
        # the verify pass: a prefill of the last token and the drafts that keeps every position's logits
        logits = prefill(model, ids, cache, logits_to_keep=ids.shape[1]).logits[0]  # [1 + drafts, vocab]
        kept, token = _verify(logits, drafts, q, params, generator, context, result.tokens)
        cache.length = before + 1 + kept  # the last token and the kept drafts; the rest is overwritten later
        draft.rollback(len(seen) + kept)
        result.rounds += 1
        result.drafted += len(drafts)
        result.accepted += kept
        result.rejections += kept < len(drafts)
        result.rounds_without_draft += room > 0 and not drafts
        result.accepted_per_round.append(kept)
        result.drafted_per_round.append(len(drafts))
        result.drafts_per_round.append(list(drafts))
        result.tokens += drafts[:kept] + [token]
    end = next((i for i, t in enumerate(result.tokens) if t in stops), None)
    if end is not None:  # a round can keep drafts past a stop token: cut after the first
        result.tokens = result.tokens[:end + 1]
    return result


def _verify(logits, drafts, q, params, generator, prompt=(), output=()) -> tuple[int, int]:
    """(how many drafts to keep, the token that follows them) from the model's logits [1 + drafts, vocab].
    prompt, output: the ids before the round (the penalties count them and the drafts before each position)."""
    penalties = params.penalties
    if penalties is not None:  # position i follows the output so far and drafts 0 .. i - 1
        logits = torch.stack([penalties.apply(row, prompt, [*output, *drafts[:i]]) for i, row in enumerate(logits)])
        params = _without_penalties(params)  # applied: the rows below are the penalized logits
    if params.greedy:  # keep the drafts while each is the model's own choice
        choices = greedy(logits).tolist()  # [1 + drafts]: one read back to the host for the whole round
        kept = next((i for i, x in enumerate(drafts) if x != choices[i]), len(drafts))
        return kept, choices[kept]
    p_all = next_token_probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)  # [1 + drafts, vocab]
    for i, x in enumerate(drafts):
        p = p_all[i]
        q_i = q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.numel()).to(p)
        accepted, token = accept_or_resample(p, q_i, torch.tensor([x], device=p.device), generator)
        if not bool(accepted[0]):
            return i, int(token[0])
    return len(drafts), _choose(logits[len(drafts)], params, generator)[0]  # all kept: a bonus token from p


# --------------------------------------------------------------------------- what to expect, and a test


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """1 + a + a^2 + ... + a^k: the expected tokens from one round when each draft is kept with probability a."""
    if not 0 <= acceptance <= 1:
        raise CourseError(f"An acceptance rate lies between 0 and 1, not {acceptance}.")
    return float(sum(acceptance ** i for i in range(k + 1)))


def predicted_speedup(acceptance: float, k: int, verify_cost: float, draft_cost: float = 0.0) -> float:
    """Expected speedup over plain decoding: tokens per round / (cost of a round in plain decode steps).

    verify_cost: time of one pass over k + 1 tokens divided by one decode step (a little above 1 when memory-bound);
    draft_cost: time of one draft token in decode steps (0 for prompt lookup).
    """
    return expected_tokens_per_round(acceptance, k) / (verify_cost + k * draft_cost)


def predicted_from_widths(result: SpeculativeResult, widths: list[int], pass_costs: list[float]) -> float:
    """The speedup a run's own rounds predict: its tokens after the first / the cost of its passes, each priced at its
    real width (1 + the drafts it verified; a round that found no draft is a plain step, width 1), in decode steps.
    widths, pass_costs: measured costs of a pass over that many tokens (1 at width 1), interpolated between."""
    if len(widths) != len(pass_costs) or not widths or sorted(widths) != list(widths):
        raise CourseError("Give the measured pass costs as increasing widths and one cost each, e.g. [1, 3], [1.0, 1.2].")
    cost = sum(float(np.interp(1 + d, widths, pass_costs)) for d in result.drafted_per_round)
    return (len(result.tokens) - 1) / cost if cost else 1.0


def leviathan_speedup(acceptance: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan et al. (2023)'s expected speedup, (1 - a^(k+1)) / ((1 - a)(k c + 1)): c is one draft token's cost over
    one step of the model, and the verify pass is priced as one step (memory-bound: k + 1 tokens cost one read).
    verify_cost: the pass over k + 1 tokens in steps where it was measured (1 is Leviathan's assumption)."""
    if c < 0 or verify_cost <= 0:
        raise CourseError(f"A draft's cost c is a time ratio, 0 or more, and a pass costs more than 0 steps; not c = "
                          f"{c}, verify_cost = {verify_cost}.")
    return expected_tokens_per_round(acceptance, k) / (k * c + verify_cost)


def batched_speculation_speedup(acceptance: float, k: int, batch: int, ridge: float) -> float:
    """Speculation's speedup at batch `batch` by the roofline, with free drafts: a plain step multiplies `batch` rows
    by every weight and costs max(1, batch / ridge) memory-bound steps; a verify pass brings batch (k + 1) rows and
    costs max(1, batch (k + 1) / ridge). A round gives E = 1 + a + ... + a^k tokens a sequence, so the speedup is
    E / (pass cost / plain step cost): E below the ridge, falling towards E / (k + 1) far past it."""
    if batch < 1 or ridge <= 0:
        raise CourseError(f"A batch holds 1 sequence or more and a ridge is above 0, not batch = {batch}, "
                          f"ridge = {ridge}.")
    pass_cost = max(1.0, batch * (k + 1) / ridge) / max(1.0, batch / ridge)
    return expected_tokens_per_round(acceptance, k) / pass_cost


def first_losing_batch(acceptance: float, k: int, ridge: float, up_to: int = 4096) -> int | None:
    """The smallest batch at which batched_speculation_speedup drops below 1 (None if none up to `up_to`)."""
    return next((b for b in range(1, up_to + 1) if batched_speculation_speedup(acceptance, k, b, ridge) < 1 - 1e-9), None)


def best_draft_length(acceptance: float, c: float, k_max: int = 16, widths: list[int] | None = None,
                      pass_costs: list[float] | None = None) -> int:
    """The draft length from 1 to k_max that leviathan_speedup puts highest (a cheap draft and a high acceptance
    rate want long drafts; a costly one, short). Without widths, every verify pass costs one step (Leviathan's
    assumption). With widths and pass_costs (a pass over that many tokens, measured, in decode steps, as
    predicted_from_widths takes them), a pass over k + 1 tokens costs what was measured, interpolated between the
    widths timed; k stops at the widest pass timed (no pass is priced by extrapolation)."""
    cost = lambda k: 1.0  # noqa: E731
    if widths is not None or pass_costs is not None:
        if (widths is None or pass_costs is None or len(widths) != len(pass_costs) or not widths
                or sorted(widths) != list(widths) or widths[0] != 1 or min(pass_costs) <= 0):
            raise CourseError("Give measured pass costs as increasing widths from 1 and one positive cost each, e.g. "
                              "widths=[1, 3, 9], pass_costs=[1.0, 1.2, 1.9].")
        k_max = min(k_max, widths[-1] - 1)
        cost = lambda k: float(np.interp(k + 1, widths, pass_costs))  # noqa: E731
    if k_max < 1:
        raise CourseError(f"Draft lengths start at 1; k_max = {k_max} leaves none (time a pass over 2 tokens or more).")
    return max(range(1, k_max + 1), key=lambda k: leviathan_speedup(acceptance, k, c, cost(k)))


def same_greedy_tokens(plain: list[int], others: dict[str, list[int]]) -> tuple[bool, str]:
    """C18's greedy half: (every list in `others` equals `plain`, token for token, the evidence). plain: the plain
    greedy tokens; others: {name: tokens} of each speculative run (each cut at the same stop). A verifier that kept
    a draft the model would not have chosen (or a cache not rolled back) gives other tokens, and this fails."""
    def first_difference(tokens):
        return next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), min(len(tokens), len(plain)))
    differ = {name: first_difference(t) for name, t in others.items() if t != plain}
    return not differ, (f"{len(plain)} greedy tokens identical: plain decoding and " + ", ".join(others)
                        if not differ else f"{len(plain)} plain greedy tokens; differ from them: "
                        + ", ".join(f"{name} (from token {i})" for name, i in differ.items()))


def counted_passes(model, run):
    """(run(), how many passes of `model` ran during it): each pass embeds its tokens once, so this counts the calls
    of model.embed_tokens. Use it with a draft that does not share the model's embedding (prompt lookup): a
    layer-skipping draft's passes would count too."""
    calls = [0]
    handle = model.embed_tokens.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        result = run()
    finally:
        handle.remove()
    return result, calls[0]


def greedy_speculation_evidence(plain: list[int], others: dict[str, list[int]], result: SpeculativeResult,
                                passes: int) -> tuple[bool, str]:
    """C18's greedy half in full: (every run in `others` gives the plain greedy tokens (same_greedy_tokens), and the
    speculative `result` took fewer passes of the model than plain decoding would, the evidence). passes: the model's
    passes counted during `result`'s run (counted_passes). Plain decoding makes one token a pass after the prefill's
    first, len(tokens) - 1 passes; so must speculation hold passes == 1 + rounds (the prefill, then one verify pass a
    round: the drafts checked together, not one pass each) and rounds < len(tokens) - 1 (some drafts kept). A verifier
    that keeps no draft gives the plain tokens at one pass a token, and fails the second."""
    same, evidence = same_greedy_tokens(plain, others)
    one_pass_a_round = passes == 1 + result.rounds
    fewer = result.rounds < len(result.tokens) - 1
    return (same and one_pass_a_round and fewer,
            evidence + f"; the model ran {passes} passes for {len(result.tokens)} tokens: the prefill and "
            f"{result.rounds} rounds of one verify pass each" + ("" if one_pass_a_round else " (it did not)")
            + f", {'fewer' if fewer else 'not fewer'} than plain decoding's {len(result.tokens) - 1} after the prefill "
            f"({result.acceptance_rate:.0%} of the drafts examined kept)")
