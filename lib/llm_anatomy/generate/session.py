"""The decoding loop, one token at a time, on the from-scratch model and its KV cache (claim C8).

    session = GenerationSession(model, tokenizer, max_new_tokens=40)
    first = session.prefill("What is the capital of France?")   # the whole prompt in one pass
    nxt = session.step()                                          # feeds only the newest token

`prefill` runs the prompt once, fills the KV cache and chooses the first new token from the last
position's logits. Each `step` feeds only the newest token (its K and V are appended to the cache)
and chooses the next one. The newest token is chosen but not fed yet, so its logits are kept:
`resample(temperature=..., top_k=..., top_p=..., min_p=..., penalties=...)` draws the current token again from
the same logits, without running the model. Penalties (penalties.Penalties) act on the logits before the filters.
Generation stops at the end-of-turn token or the length limit.

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
from .sampling import SamplingSettings, sample_with, seeded_generator
from .steps import StepResult, top_candidates
from ..model.scratch import ScratchLlama

_KEEP = object()  # "leave this setting as it is" in resample()


@dataclass
class GenerationSession:
    """Prefill once, then decode step by step on a ScratchLlama with a preallocated KV cache.

    model: a ScratchLlama (llm_anatomy.model.scratch); tokenizer: its transformers tokenizer.
    The session calls the course's one decoding loop, `decode.prefill` and `decode.decode_step`.
    max_new_tokens: stop after this many new tokens (also capped by the model's context).
    settings: how tokens are chosen (temperature 0 = greedy); penalties: on tokens already seen (off by default);
    seed: for the sampling generator.
    attention: (layer, head) to record the newest token's attention row at every call, or None.
    top_n: how many candidates each StepResult lists.
    """

    model: ScratchLlama = field(repr=False)
    tokenizer: object = field(repr=False)
    max_new_tokens: int = 64
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0
    attention: tuple[int, int] | None = None
    top_n: int = 10
    stop_ids: tuple[int, ...] = ()
    penalties: Penalties = field(default_factory=Penalties)

    def __post_init__(self):
        if not isinstance(self.model, ScratchLlama):
            raise CourseError("GenerationSession runs the from-scratch model: pass ScratchLlama.from_hf(load_model()).")
        self._new_options(None, None, None, _KEEP, None)  # validates the options given
        self.generator = seeded_generator(self.seed)
        self.stop_ids = tuple(self.stop_ids) or end_of_turn_ids(self.tokenizer)
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
        """Forget the prompt and everything generated (the settings and seed stay)."""
        self.cache = None
        self.prompt_ids, self.generated, self.steps = [], [], []
        self.prefill_ms, self._logits, self._limit = None, None, 0
        self.generator = seeded_generator(self.seed)

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

    def prefill(self, prompt: str | list[int], chat: bool = True, *, max_new_tokens: int | None = None,
                settings: SamplingSettings | None = None, seed: int | None = None, attention=_KEEP,
                penalties: Penalties | None = None) -> StepResult:
        """Run the whole prompt through the model once, fill the KV cache, and choose the first new token.

        `prompt` is text (wrapped in the chat template when chat=True) or a list of token ids.
        max_new_tokens, settings, seed, attention, penalties: new options for this run; like the prompt, they take effect
        only if the prefill succeeds (a refused call leaves the session exactly as it was).
        Starts over if the session already ran. Returns the first token's StepResult (ms = prefill time).
        """
        options = self._new_options(max_new_tokens, settings, seed, attention, penalties)  # validated first
        if isinstance(prompt, (list, tuple)):
            ids = [int(i) for i in prompt]
            if not ids:
                raise CourseError("The prompt is empty: give at least one token id.")
            self._check_prompt_length(ids)
        else:
            ids = self.prompt_token_ids(prompt, chat)
        limit = min(options["max_new_tokens"], self.context_length - len(ids))
        cache = self.model.new_cache(1, len(ids) + limit)
        generator = seeded_generator(options["seed"])  # a fresh start: the same seed gives the same tokens
        logits, first = self._call(ids, cache, index=0, limit=limit, generator=generator, settings=options["settings"],
                                   attention=options["attention"], penalties=options["penalties"])
        # all went well: commit the new state
        for name, value in options.items():
            setattr(self, name, value)
        self.reset()
        self.cache, self.prompt_ids, self._limit, self.generator = cache, ids, limit, generator
        self._commit(first, logits)
        self.prefill_ms = first.ms
        return first

    def _new_options(self, max_new_tokens, settings, seed, attention, penalties) -> dict:
        """The session's options with the given ones changed, each validated (CourseError before any change)."""
        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise CourseError(f"max_new_tokens must be a whole number >= 1, not {max_new!r}.")
        settings = self.settings if settings is None else settings
        if not isinstance(settings, SamplingSettings):
            raise CourseError("settings must be a SamplingSettings(temperature=..., top_k=..., top_p=...).")
        seed = self.seed if seed is None else seed
        seeded_generator(seed)  # validates
        attention = self.attention if attention is _KEEP else attention
        self.check_attention(attention)
        penalties = self.penalties if penalties is None else penalties
        if not isinstance(penalties, Penalties):
            raise CourseError("penalties must be a Penalties(repetition=..., presence=..., frequency=...).")
        return {"max_new_tokens": max_new, "settings": settings, "seed": seed, "attention": attention,
                "penalties": penalties}

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
        settings = self._updated_settings(temperature, top_k, top_p, min_p)  # validates: CourseError before any change
        penalties = self._new_options(None, settings, None, _KEEP, None if penalties is _KEEP else penalties)["penalties"]
        if not self.prefilled:
            self.settings, self.penalties = settings, penalties
            return None
        previous = self.steps[-1]
        result = self._choose(self._logits, index=previous.index, fed=previous.fed_tokens, cache=self.cache,
                              limit=self._limit, attention=previous.attention, settings=settings,
                              prompt=self.prompt_ids, penalties=penalties)
        result = dataclasses.replace(result, ms=previous.ms, resampled=True)
        self.settings, self.penalties = settings, penalties
        self.generated[-1] = result.token_id
        self.steps[-1] = result
        return result

    def set_settings(self, temperature=_KEEP, top_k=_KEEP, top_p=_KEEP, min_p=_KEEP, *, penalties=_KEEP) -> None:
        """Change the settings for the next steps without touching the current token."""
        settings = self._updated_settings(temperature, top_k, top_p, min_p)
        penalties = self._new_options(None, settings, None, _KEEP, None if penalties is _KEEP else penalties)["penalties"]
        self.settings, self.penalties = settings, penalties

    def _updated_settings(self, temperature, top_k, top_p, min_p) -> SamplingSettings:
        """The current settings with the given ones changed (_KEEP leaves one as it is); validated."""
        changes = {name: value for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                                   ("min_p", min_p)) if value is not _KEEP}
        return dataclasses.replace(self.settings, **changes)

    def set_seed(self, seed: int) -> None:
        """Use `seed` from the next prefill on (the current run keeps its draws)."""
        seeded_generator(seed)  # validates
        self.seed = seed

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
    def _call(self, ids: list[int], cache, *, index: int, limit: int, generator=None, settings=None,
              attention=_KEEP, penalties=None) -> tuple[torch.Tensor, StepResult]:
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
                                        settings=settings, generator=generator, penalties=penalties,
                                        prompt=ids if index == 0 else self.prompt_ids)

        seconds, (logits, result) = timed(work, self.model.device)
        return logits, dataclasses.replace(result, ms=seconds * 1e3)

    def _choose(self, logits, *, index, fed, cache, limit, attention, prompt, settings=None, generator=None,
                penalties=None) -> StepResult:
        """The token chosen from the raw logits [vocab]: penalties on the prompt and the tokens before `index`,
        then the sampling settings."""
        settings, penalties = settings or self.settings, penalties or self.penalties
        scores = penalties.apply(logits, prompt, self.generated[:index] if index else [])
        token, probs = sample_with(scores, settings, generator or self.generator)
        token = int(token)
        candidates = top_candidates(logits, probs, token, self.top_n, self.token_texts)
        reason = "eos" if token in self.stop_ids else "length" if index + 1 >= limit else None  # None: go on
        return StepResult(index=index, token_id=token, text=self.tokenizer.decode([token]), prob=float(probs[token]),
                          candidates=candidates, fed_tokens=fed, cache_tokens=cache.length,
                          cache_bytes=cache.used_bytes(), cache_capacity_tokens=cache.max_len,
                          cache_capacity_bytes=cache.allocated_bytes(), ms=0.0, settings=settings,
                          finished=reason is not None, stop_reason=reason, attention=attention)

    def _commit(self, result: StepResult, logits: torch.Tensor) -> None:
        self.generated.append(result.token_id)
        self.steps.append(result)
        self._logits = logits


def generate(model, tokenizer, prompt: str | list[int], max_new_tokens: int = 64, chat: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
             min_p: float = 0.0, penalties: Penalties | None = None) -> str:
    """The generated text for `prompt` (greedy by default), special tokens removed."""
    session = GenerationSession(model, tokenizer, max_new_tokens=max_new_tokens, seed=seed,
                                settings=SamplingSettings(temperature, top_k, top_p, min_p),
                                penalties=penalties or Penalties())
    session.generate(prompt, chat)
    return tokenizer.decode(session.generated, skip_special_tokens=True)
