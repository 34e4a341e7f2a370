"""The sampler: a request's next token from its logits, by the request's own sampling parameters.

A server's requests each ask for their own way of choosing (greedy, or a temperature with filters), their own seed,
penalties and logprobs. All of it travels on the request as one `SamplingParams` (generate/sampling.py: vLLM's and
nano-vllm's name), so the engine keeps no table of settings keyed by request id, and a request's draws come from its
own generator: they do not depend on which other requests share its batch.
"""

from __future__ import annotations

import torch

from ..generate.sampling import sample_next, seeded_generator, token_logprobs


def sample(request, logits: torch.Tensor) -> int:
    """The next token of `request` (a serve.batching.Request) from its logits `[vocab]`, by generate/sampling's one
    sampler `sample_next` with the request's params: penalties on its prompt and output, the filters, then the highest
    (greedy) or a draw from the request's own generator (made from params.seed at its first draw). The logprobs
    recorded (when params.top_logprobs asks) are those of the penalized logits, before temperature and filters.

    A request with a constraint (its response_format: server/structured.RowMask) has the tokens its grammar state
    refuses masked to -inf before the draw, and its state advanced by the token drawn; its logprobs stay the model's
    own, before the mask, as vLLM's are by default (a masked token's -inf has no place in JSON)."""
    params = request.params
    if not params.greedy and request.generator is None:
        request.generator = seeded_generator(params.seed, logits.device)
    penalties = params.penalties
    masked = logits if request.constraint is None else request.constraint.apply(logits)
    token = int(sample_next(masked, params, request.generator, prompt=request.prompt, output=request.output)[0])
    if params.top_logprobs is not None:
        scores = logits if penalties is None else penalties.apply(logits, request.prompt, request.output)
        request.logprobs.append(token_logprobs(scores, token, params.top_logprobs))
    if request.constraint is not None:
        request.constraint.advance(token)
    return token
