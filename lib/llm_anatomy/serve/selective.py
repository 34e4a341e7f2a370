"""Selective batching (Orca's second idea): the batch flattened into one stream of tokens, attention per request.

A padded batch is a rectangle `[rows, longest, hidden]`: every row is padded to the longest prompt, and every pad
column goes through every projection and MLP. But only attention mixes the tokens of a request; every other layer
(the norms, the q/k/v/o projections, the MLP, the LM head) treats each token on its own. So Orca runs those on all
the batch's tokens laid end to end, `[total_tokens, hidden]`, with no padding at all, and splits the stream by
request only for attention. vLLM and SGLang lay out every iteration this way (prompt chunks and decode tokens in one
stream). `flattened_prefill` does it for prompts over our model's own layers; the logits equal the padded batch's
at every real position, to float rounding.

The split is vLLM's: the code that builds the batch computes each token's position (`flat_positions`: each row's
cached length + 0, 1, 2 ..., end to end) and passes it to the model with the tokens; FlatBatch, the cache, only says
where each row's stretch lies and lets each row attend to its own keys. The model checks the context against those
positions, row by row, never against the stream's total length.
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from ..model.kv_cache import KVCacheInterface


class FlatBatch(KVCacheInterface):
    """Rows of new tokens laid end to end as one sequence `[1, total]`, as the model's one forward pass sees it.

    news[i]: row i's new tokens. The model runs every layer but attention on the whole stream; `attend` splits it by
    row: each row's queries see only its own keys, causal within the row. Where its tokens sit for RoPE is the
    builder's to say (flat_positions); nothing is stored here, and no position is counted.
    """

    batch_size = 1  # to the model: one row

    def __init__(self, news: list[int], device=None):
        ends = torch.tensor(news).cumsum(0).tolist()
        self.spans = list(zip([0] + ends[:-1], ends))  # each row's stretch of the stream
        self.last = torch.tensor([b - 1 for _, b in self.spans], device=device)  # [rows] each row's last token

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        return k, v  # nothing is kept

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel):
        """q `[1, heads, total, d]`, k and v `[1, kv_heads, total, d]`: each row's own stretch only."""
        out = torch.cat([kernel(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])[0] for a, b in self.spans], dim=2)
        return out, None  # [1, heads, total, d]

    def advance(self, new: int) -> None:
        """Nothing to count: whoever made the batch keeps each row's length."""


def flat_positions(cached: list[int], news: list[int], device=None) -> torch.Tensor:
    """Each token's RoPE position in a flattened batch, `[total]`: row i's cached[i], cached[i] + 1, ... for its
    news[i] new tokens, the rows end to end (vLLM's positions tensor)."""
    return torch.cat([torch.arange(past, past + n, device=device) for past, n in zip(cached, news)])


@torch.inference_mode()
def flattened_prefill(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits `[len(prompt), vocab]` of each prompt, all prompts' tokens in one `[total_tokens, hidden]` pass through
    every layer but attention, which runs per request over its own stretch of the stream (causal, nothing cached).
    It is the model's own forward pass: the flattening is all in FlatBatch."""
    if not prompts or not all(prompts):
        raise CourseError("Give at least one prompt, each at least one token id.")
    ids = torch.tensor([[t for p in prompts for t in p]], device=model.device)  # [1, total]
    news = [len(p) for p in prompts]
    batch = FlatBatch(news, device=model.device)
    positions = flat_positions([0] * len(prompts), news, model.device)  # [total] each prompt from 0
    logits = model.trace(ids, batch, positions=positions, keep_hidden=False).logits[0]  # [total, vocab]
    return [logits[a:b] for a, b in batch.spans]


def padded_tokens(prompts: list[list[int]]) -> int:
    """Token columns a left-padded batch of `prompts` computes: rows x the longest prompt."""
    return len(prompts) * max(len(p) for p in prompts)
