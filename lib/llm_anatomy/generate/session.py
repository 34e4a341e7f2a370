"""The decoding loop, one token at a time, on the from-scratch model and its KV cache (claim C8).

    session = GenerationSession(model, tokenizer, SamplingParams(max_tokens=40))
    first = session.prefill("What is the capital of France?")   # the whole prompt in one pass
    nxt = session.step()                                          # feeds only the newest token

`prefill` runs the prompt once, fills the KV cache and chooses the first new token from the last
position's logits. Each `step` feeds only the newest token (its K and V are appended to the cache)
and chooses the next one. The newest token is chosen but not fed yet, so its logits are kept:
`resample(temperature=..., top_k=..., top_p=..., min_p=..., penalties=...)` draws the current token again from
the same logits, without running the model. Penalties (penalties.py) act on the logits before the filters.
Everything about the choice and the stop is the session's one `SamplingParams` (sampling.py); generation stops by
stops.finish_reason: at one of params.stop_token_ids (by default the tokenizer's end-of-turn ids) or the length limit.

Every call returns a `StepResult` (steps.py) with what a view needs (token, candidates, cache size, time).
A refused call (CourseError) leaves the session exactly as it was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from .chat import chat_prompt_ids, end_of_turn_ids
from .decode import decode_step, prefill
from .penalties import Penalties
from ..device import timed
from ..errors import CourseError
from .sampling import SamplingParams, sample_next, seeded_generator
from .steps import StepResult, top_candidates
from .stops import finish_reason
from ..model.scratch import ScratchLlama

_KEEP = object()  # "leave this setting as it is" in resample()


@dataclass
class GenerationSession:
    """Prefill once, then decode step by step on a ScratchLlama with a preallocated KV cache.

    model: a ScratchLlama (llm_anatomy.model.scratch); tokenizer: its transformers tokenizer.
    The session calls the course's one decoding loop, `decode.prefill` and `decode.decode_step`.
    params: how tokens are chosen and when to stop (a SamplingParams: temperature 0 = greedy; the penalties act on
    the tokens already seen; seed: for the sampling generator; max_tokens: new tokens at most, also capped by the
    model's context; stop_token_ids: none given means the tokenizer's end-of-turn ids; stop strings are refused;
    top_logprobs is not read: each StepResult lists its top_n candidates with their probabilities).
    attention: (layer, head) to record the newest token's attention row at every call, or None.
    top_n: how many candidates each StepResult lists.
    constraint: None, or a grammar (constrained.GrammarConstraint, notebook 12): its .allowed(generated ids) is a bool
    [vocab] of the tokens allowed next; the others' logits become -inf before the penalties, filters and draw.
    """

    model: ScratchLlama = field(repr=False)
    tokenizer: object = field(repr=False)
    params: SamplingParams = field(default_factory=SamplingParams)
    attention: tuple[int, int] | None = None
    top_n: int = 10
    constraint: object | None = field(default=None, repr=False)

    def __post_init__(self):
        if not isinstance(self.model, ScratchLlama):
            raise CourseError("GenerationSession runs the from-scratch model: pass ScratchLlama.from_hf(load_model()).")
        options = self._new_options(None, _KEEP)  # validates the options given
        self.params = options["params"]
        self.generator = seeded_generator(self.params.seed)
        self.cache = None
        self.prompt_ids: list[int] = []
        self.generated: list[int] = []
        self.steps: list[StepResult] = []
        self.prefill_ms: float | None = None
        self._logits: torch.Tensor | None = None  # [vocab] float32 on the CPU: the logits the newest token came from
        self._limit = 0

    # ---- state -------------------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        return self.model.cfg.max_position_embeddings

    @property
    def prefilled(self) -> bool:
        return self.cache is not None

    @property
    def finished(self) -> bool:
        return bool(self.steps) and self.steps[-1].finished

    @property
    def last(self) -> StepResult | None:
        return self.steps[-1] if self.steps else None

    @property
    def text(self) -> str:
        """The generated text so far (special tokens kept, so an end-of-turn token shows)."""
        return self.tokenizer.decode(self.generated)

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token on its own (a character split across tokens shows as \ufffd)."""
        return [self.tokenizer.decode([i]) for i in ids]

    def reset(self) -> None:
        """Forget the prompt and everything generated (the params stay)."""
        self.cache = None
        self.prompt_ids, self.generated, self.steps = [], [], []
        self.prefill_ms, self._logits, self._limit = None, None, 0
        self.generator = seeded_generator(self.params.seed)

    # ---- the prompt ----------------------------------------------------------------------------
    def prompt_token_ids(self, prompt: str, chat: bool = True) -> list[int]:
        """The ids the model reads for `prompt`: the chat template around one user turn, or the plain text."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise CourseError("The prompt is empty: type some text first.")
        ids = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": prompt}])[0].tolist() if chat else \
            self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        self._check_prompt_length(ids)
        return ids

    def _check_prompt_length(self, ids: list[int]) -> None:
        if len(ids) >= self.context_length:
            raise CourseError(f"The prompt is {len(ids)} tokens, and the model reads at most {self.context_length}: "
                              "shorten it to leave room for an answer.")

    def prefill(self, prompt: str | list[int], chat: bool = True, *, params: SamplingParams | None = None,
                attention=_KEEP) -> StepResult:
        """Run the whole prompt through the model once, fill the KV cache, and choose the first new token.

        `prompt` is text (wrapped in the chat template when chat=True) or a list of token ids.
        params, attention: new options for this run; like the prompt, they take effect only if the prefill succeeds
        (a refused call leaves the session exactly as it was).
        Starts over if the session already ran. Returns the first token's StepResult (ms = prefill time).
        """
        options = self._new_options(params, attention)  # validated first
        if isinstance(prompt, (list, tuple)):
            ids = [int(i) for i in prompt]
            if not ids:
                raise CourseError("The prompt is empty: give at least one token id.")
            self._check_prompt_length(ids)
        else:
            ids = self.prompt_token_ids(prompt, chat)
        limit = min(options["params"].max_tokens, self.context_length - len(ids))
        cache = self.model.new_cache(1, len(ids) + limit)
        generator = seeded_generator(options["params"].seed)  # a fresh start: the same seed gives the same tokens
        logits, first = self._call(ids, cache, index=0, limit=limit, generator=generator, params=options["params"],
                                   attention=options["attention"])
        # all went well: commit the new state
        for name, value in options.items():
            setattr(self, name, value)
        self.reset()
        self.cache, self.prompt_ids, self._limit, self.generator = cache, ids, limit, generator
        self._commit(first, logits)
        self.prefill_ms = first.ms
        return first

    def _new_options(self, params, attention) -> dict:
        """The session's options with the given ones changed, each validated (CourseError before any change).
        Params without stop ids stop at the tokenizer's end-of-turn ids."""
        params = self.params if params is None else params
        if not isinstance(params, SamplingParams):
            raise CourseError(f"params must be a SamplingParams(temperature=..., max_tokens=...), not {params!r}.")
        if params.stop:
            raise CourseError(f"The session stops on token ids (stop_token_ids), not on stop strings like "
                              f"{params.stop[0]!r}: a server's StopMatcher cuts those from the text.")
        if not params.stop_token_ids:
            params = dataclasses.replace(params, stop_token_ids=end_of_turn_ids(self.tokenizer))
        attention = self.attention if attention is _KEEP else attention
        self.check_attention(attention)
        return {"params": params, "attention": attention}

    # ---- decoding --------------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Feed the newest token (one position), append its K and V to the cache, choose the next token."""
        self.check_can_step()
        logits, result = self._call([self.generated[-1]], self.cache, index=len(self.generated), limit=self._limit)
        self._commit(result, logits)
        return result

    def resample(self, temperature=_KEEP, top_k=_KEEP, top_p=_KEEP, min_p=_KEEP, *, penalties=_KEEP) -> StepResult:
        """Choose the newest token again from the logits already computed, with new settings (no model call).

        Settings not given stay as they are; the new ones stay for the following steps.
        """
        params = self._updated_params(temperature, top_k, top_p, min_p, penalties)  # CourseError before any change
        if not self.prefilled:
            self.params = params
            return None
        previous = self.steps[-1]
        result = self._choose(self._logits, index=previous.index, fed=previous.fed_tokens, cache=self.cache,
                              limit=self._limit, attention=previous.attention, params=params, prompt=self.prompt_ids)
        result = dataclasses.replace(result, ms=previous.ms, resampled=True)
        self.params = params
        self.generated[-1] = result.token_id
        self.steps[-1] = result
        return result

    def set_settings(self, temperature=_KEEP, top_k=_KEEP, top_p=_KEEP, min_p=_KEEP, *, penalties=_KEEP) -> None:
        """Change the sampling params for the next steps without touching the current token."""
        self.params = self._updated_params(temperature, top_k, top_p, min_p, penalties)

    def _updated_params(self, temperature, top_k, top_p, min_p, penalties) -> SamplingParams:
        """The current params with the given fields changed (_KEEP leaves one as it is; penalties: a Penalties for
        the three penalty fields); validated."""
        changes = {name: value for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                                   ("min_p", min_p)) if value is not _KEEP}
        if penalties is not _KEEP:
            if not isinstance(penalties, Penalties):
                raise CourseError("penalties must be a Penalties(repetition=..., presence=..., frequency=...).")
            changes.update(repetition_penalty=penalties.repetition, presence_penalty=penalties.presence,
                           frequency_penalty=penalties.frequency)
        return dataclasses.replace(self.params, **changes)

    def set_seed(self, seed: int) -> None:
        """Use `seed` from the next prefill on (the current run keeps its draws)."""
        self.params = dataclasses.replace(self.params, seed=seed)  # validates

    def set_attention(self, attention: tuple[int, int] | None) -> None:
        """Record the attention row of (layer, head) from the next model call on, or None to stop."""
        self.check_attention(attention)
        self.attention = attention

    def generate(self, prompt: str | list[int], chat: bool = True) -> list[StepResult]:
        """prefill, then step until the end-of-turn token or the length limit; all StepResults."""
        results = [self.prefill(prompt, chat)]
        while not self.finished:
            results.append(self.step())
        return results

    # ---- checks (public: a view asks them before it acts) -----------------------------------------
    def check_can_step(self) -> None:
        """Raise CourseError when there is nothing to step: no prefill yet, or generation has finished."""
        if not self.prefilled:
            raise CourseError("Nothing to continue yet: prefill a prompt first.")
        if self.finished:
            reason = self.steps[-1].stop_reason
            why = "the model ended its turn" if reason == "eos" else f"the limit of {self._limit} new tokens is reached"
            raise CourseError(f"Generation has finished ({why}): reset or prefill a new prompt.")

    def check_attention(self, attention) -> None:
        """Raise CourseError unless `attention` is None or a valid (layer, head) of this model."""
        if attention is not None and not (isinstance(attention, (tuple, list)) and len(attention) == 2):
            raise CourseError(f"attention must be (layer, head) or None, not {attention!r}.")
        if attention is not None:
            self.model.cfg.check_layer_head(*attention, what="attention's ")

    # ---- helpers ----------------------------------------------------------------------------------
    def _call(self, ids: list[int], cache, *, index: int, limit: int, generator=None, params=None,
              attention=_KEEP) -> tuple[torch.Tensor, StepResult]:
        """One model call (prefill for the prompt, decode_step for one token) and the choice of the next token.

        Returns the logits `[vocab]` (CPU float32) of the last position and the StepResult, whose ms is the wall
        time of the call and the choice together.
        """
        attention = self.attention if attention is _KEEP else attention
        layers = (attention[0],) if attention else ()

        def work():
            x = torch.tensor([ids], device=self.model.device)  # [1, seq]
            run = prefill if index == 0 else decode_step
            out = run(self.model, x, cache, attention_layers=layers)
            row = out.attentions[attention[0]][0, attention[1], -1].float().cpu() if attention else None  # [positions]
            logits = out.logits[0, -1].float().cpu()
            return logits, self._choose(logits, index=index, fed=len(ids), cache=cache, limit=limit, attention=row,
                                        params=params, generator=generator,
                                        prompt=ids if index == 0 else self.prompt_ids)

        seconds, (logits, result) = timed(work, self.model.device)
        return logits, dataclasses.replace(result, ms=seconds * 1e3)

    def _choose(self, logits, *, index, fed, cache, limit, attention, prompt, params=None,
                generator=None) -> StepResult:
        """The token chosen from the raw logits [vocab] by sampling.sample_next (penalties on the prompt and the
        tokens before `index`, then the filters and the draw), and whether to stop (stops.finish_reason, the length
        capped at `limit`; its "stop" is shown as "eos")."""
        params = params or self.params
        output = self.generated[:index]
        allowed = None if self.constraint is None else self.constraint.allowed(output)
        masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
        token, probs = sample_next(masked, params, generator or self.generator, prompt=prompt, output=output)
        token = int(token)
        candidates = top_candidates(logits, probs, token, self.top_n, self.token_texts, allowed)
        reason = finish_reason(dataclasses.replace(params, max_tokens=limit), output + [token])  # None: go on
        reason = "eos" if reason == "stop" else reason
        return StepResult(index=index, token_id=token, text=self.tokenizer.decode([token]), prob=float(probs[token]),
                          candidates=candidates, fed_tokens=fed, cache_tokens=cache.length,
                          cache_bytes=cache.used_bytes(), cache_capacity_tokens=cache.max_len,
                          cache_capacity_bytes=cache.allocated_bytes(), ms=0.0, params=params,
                          finished=reason is not None, stop_reason=reason, attention=attention,
                          allowed_tokens=None if allowed is None else int(allowed.sum()))

    def _commit(self, result: StepResult, logits: torch.Tensor) -> None:
        self.generated.append(result.token_id)
        self.steps.append(result)
        self._logits = logits


def generate(model, tokenizer, prompt: str | list[int], max_new_tokens: int = 64, chat: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
             min_p: float = 0.0, penalties: Penalties | None = None) -> str:
    """The generated text for `prompt` (greedy by default), special tokens removed."""
    penalties = penalties or Penalties()
    params = SamplingParams(temperature, top_k, top_p, min_p, penalties.repetition, penalties.presence,
                            penalties.frequency, seed=seed, max_tokens=max_new_tokens)
    session = GenerationSession(model, tokenizer, params)
    session.generate(prompt, chat)
    return tokenizer.decode(session.generated, skip_special_tokens=True)
