"""The sampler: a request's next token from its logits, by the request's own sampling parameters.

A server's requests each ask for their own way of choosing (greedy, or a temperature with filters), their own seed,
penalties and logprobs. All of it travels on the request as one `SamplingParams` (vLLM's and nano-vllm's name), so
the engine keeps no table of settings keyed by request id, and a request's draws come from its own generator: they do
not depend on which other requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError
from ..generate.penalties import Penalties
from ..generate.sampling import SamplingSettings, sample_with, seeded_generator, token_logprobs


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. settings: a SamplingSettings (None: greedy); seed: its generator's seed;
    penalties: a Penalties (None, or one with every penalty off: none); top_logprobs: record each token's logprob
    and this many alternatives (None: nothing). The default is notebook 08's greedy request."""

    settings: SamplingSettings | None = None
    seed: int = 0
    penalties: Penalties | None = None
    top_logprobs: int | None = None

    def __post_init__(self):
        if self.settings is not None and not isinstance(self.settings, SamplingSettings):
            raise CourseError(f"settings must be a SamplingSettings (or None for greedy), not {self.settings!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise CourseError(f"seed must be a whole number, not {self.seed!r}.")
        if self.penalties is not None and not isinstance(self.penalties, Penalties):
            raise CourseError("penalties must be a Penalties(repetition=..., presence=..., frequency=...) or None.")
        if self.penalties is not None and not self.penalties.active:
            object.__setattr__(self, "penalties", None)  # all off: nothing to apply (and the logits keep their dtype)
        top = self.top_logprobs
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
            raise CourseError(f"top_logprobs must be None or a whole number >= 0, not {top!r}.")

    @property
    def greedy(self) -> bool:
        return self.settings is None or self.settings.greedy


def sample(request, logits: torch.Tensor) -> int:
    """The next token of `request` (a serve.batching.Request) from its logits `[vocab]`: the highest when its params
    are greedy, else drawn with the request's own generator (made from params.seed at its first draw). Penalties
    apply first, as GenerationSession applies them, so the logprobs recorded (when params.top_logprobs asks) are the
    penalized ones."""
    params = request.params
    if params.penalties is not None:
        logits = params.penalties.apply(logits, request.prompt, request.output)
    if params.greedy:
        token = int(logits.argmax())
    else:
        if request.generator is None:
            request.generator = seeded_generator(params.seed, logits.device)
        token = int(sample_with(logits, params.settings, request.generator)[0])
    if params.top_logprobs is not None:
        request.logprobs.append(token_logprobs(logits, token, params.top_logprobs))
    return token
