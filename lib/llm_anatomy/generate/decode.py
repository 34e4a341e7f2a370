"""Prefill and decode: the course's one decoding loop (claim C8).

    out = prefill(model, prompt_ids, cache)      # the whole prompt in one pass; K and V of every position cached
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    out = decode_step(model, token, cache)       # only the newest token; its K and V are appended

`prefill` and `decode_step` are the two calls every part of the course makes: the generation session
(generation.py), the benchmarks, the checks against transformers and the notebooks. `generate_greedy`
strings them into a loop (and, with use_cache=False, shows what a model without a cache must do instead:
run the whole sequence again at every step). `StaticDecoder` is the same decode step with fixed shapes,
so that a CUDA graph can record it once and replay it (notebook 07 and the bench).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..device import timed as timed_call
from ..errors import CourseError
from ..model.kv_cache import KVCache


@torch.inference_mode()
def prefill(model, prompt_ids: torch.Tensor, cache: KVCache, *, attention_mask: torch.Tensor | None = None,
            attention_layers=()):
    """Run the prompt `[batch, seq]` (or the next chunk of it) through the model, appending its K and V to `cache`.

    Returns the model's output (llm_anatomy.model.scratch.ScratchOutput) with the logits of the last position only,
    `[batch, 1, vocab]`, and the attention weights of `attention_layers`. A call that fails leaves the cache's
    length as it was, so no half-written position is ever counted.
    """
    length_before = cache.length
    try:
        return model.trace(prompt_ids, cache, attention_mask, keep_hidden=False, attention_layers=attention_layers,
                           logits_to_keep=1)
    except Exception:
        cache.length = length_before
        raise


def decode_step(model, token_ids: torch.Tensor, cache: KVCache, *, attention_layers=()):
    """Feed only the newest token `[batch, 1]`: its K and V are appended to `cache`; logits `[batch, 1, vocab]`."""
    if token_ids.dim() != 2 or token_ids.shape[1] != 1:
        raise CourseError(f"A decode step feeds one token per sequence, [batch, 1], not {tuple(token_ids.shape)}.")
    if cache.length == 0:
        raise CourseError("The cache is empty: prefill the prompt before the first decode step.")
    return prefill(model, token_ids, cache, attention_layers=attention_layers)


@dataclass
class Generation:
    """What a greedy generation gives back.

    tokens: `[batch, new_tokens]` the generated ids. step_seconds: wall-clock seconds of each model call when
    timed (the first is the prefill, which also picks the first new token), else empty; their TPOT is
    llm_anatomy.measure.timing.median_decode_step_s(step_seconds[1:]).
    """

    tokens: torch.Tensor
    step_seconds: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        """Time to first token, seconds: the prefill call."""
        if not self.step_seconds:
            raise CourseError("This generation was not timed: use generate_greedy(..., timed=True).")
        return self.step_seconds[0]


@torch.inference_mode()
def generate_greedy(model, prompt_ids: torch.Tensor, new_tokens: int, *, use_cache: bool = True,
                    cache: KVCache | None = None, timed: bool = False) -> Generation:
    """Greedy decoding with a from-scratch model: `new_tokens` ids per sequence of `prompt_ids` `[batch, seq]`.

    use_cache=True: prefill once, then decode_step with only the newest token.
    use_cache=False: run the whole sequence again at every step (what a model without a cache must do).
    timed=True: record each model call's wall time (the device synchronized around it).
    """
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise CourseError(f"new_tokens must be a whole number, at least 1, not {new_tokens!r}.")
    batch, prompt_len = prompt_ids.shape
    if use_cache and cache is None:
        cache = model.new_cache(batch, prompt_len + new_tokens)
    out = torch.empty(batch, new_tokens, dtype=prompt_ids.dtype, device=prompt_ids.device)  # [batch, new]
    seconds: list[float] = []

    def call(i: int):
        if not use_cache:  # the whole sequence so far, every time
            return model.trace(torch.cat([prompt_ids, out[:, :i]], dim=1), keep_hidden=False, logits_to_keep=1)
        return prefill(model, prompt_ids, cache) if i == 0 else decode_step(model, out[:, i - 1:i], cache)

    for i in range(new_tokens):
        if timed:
            elapsed, result = timed_call(lambda: call(i), prompt_ids.device)
            seconds.append(elapsed)
        else:
            result = call(i)
        out[:, i] = result.logits[:, -1].argmax(-1)
    return Generation(out, seconds)


def greedy_tokens(model, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Greedy token ids for one prompt `[1, seq]` (prefill once, then one token at a time), cut after the EOS."""
    out = generate_greedy(model, prompt_ids, max_new_tokens).tokens[0].tolist()
    return out[:out.index(eos_token_id) + 1] if eos_token_id in out else out


# --------------------------------------------------------------------------- the fixed-shape step (CUDA graphs)


class _SlotWriter:
    """The cache as a fixed-shape step sees it: the write position is a tensor, and attention reads every slot."""

    def __init__(self, cache: KVCache, pos: torch.Tensor):
        self.cache, self.pos = cache, pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.cache.keys[layer].index_copy_(2, self.pos, k)  # new: the slot comes from a tensor, not a Python int
        self.cache.values[layer].index_copy_(2, self.pos, v)
        return self.cache.keys[layer], self.cache.values[layer]  # new: all max_len slots, the mask hides the unwritten


class StaticDecoder:
    """`decode_step` with fixed shapes, so that a CUDA graph can record it once and replay it with one launch.

    Eager PyTorch launches each small kernel from Python; for one token of a small model the GPU can wait
    on those launches longer than it computes. What this adds over decode_step, and why:
    - the position lives in a tensor (`pos`), not a Python int, so the recorded graph stays valid;
    - attention reads all `max_len` slots of the cache, with a key mask that hides the slots not yet written;
    - cos/sin come from a table made once for every position.
    The blocks themselves are the model's own `Block` modules: nothing of the model is written twice.
    """

    def __init__(self, model, batch: int, max_len: int):
        self.model, cfg = model, model.cfg
        self.cache = model.new_cache(batch, max_len)
        device = model.device
        self.slots = torch.arange(max_len, device=device)  # [max_len]
        self.cos, self.sin = model.rope(self.slots)  # [max_len, head_dim]
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [batch, 1] the newest token
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # where the newest token's K and V go
        self.writer = _SlotWriter(self.cache, self.pos)
        self.graph = None
        self.head_dim = cfg.head_dim

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Run the prompt through the ordinary prefill (which fills the cache) and keep the first new token."""
        self.cache.reset()
        out = prefill(self.model, prompt_ids, self.cache)
        self.token.copy_(out.logits[:, -1:].argmax(-1))
        self.pos.fill_(prompt_ids.shape[1])

    def _step(self) -> None:
        m = self.model
        cos, sin = self.cos.index_select(0, self.pos), self.sin.index_select(0, self.pos)  # [1, head_dim]
        key_mask = (self.slots <= self.pos).expand(self.token.shape[0], -1)  # [batch, max_len]: written slots
        x = m.embed_tokens(self.token)  # [batch, 1, hidden]
        for block in m.layers:
            x, _ = block(x, cos, sin, self.writer, key_mask)
        logits = m.lm_head(m.norm(x))  # [batch, 1, vocab]
        self.token.copy_(logits[:, -1:].argmax(-1))
        self.pos.add_(1)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one step in a CUDA graph (CUDA only); the state is restored after the warm-up steps.

        Raises CourseError when capture fails, so that a broken graph never passes silently.
        """
        if self.model.device.type != "cuda":
            raise CourseError("CUDA graphs need a CUDA GPU; this model is on " + self.model.device.type + ".")
        token, pos = self.token.clone(), self.pos.clone()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            self.token.copy_(token)
            self.pos.copy_(pos)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
        except Exception as err:
            self.graph = None
            raise CourseError(f"Capturing the decode step in a CUDA graph failed ({type(err).__name__}: {err}).") from err
        self.graph = graph

    @torch.inference_mode()
    def step(self) -> None:
        """One decode step: replay the graph when captured, else run eagerly."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy tokens `[batch, new_tokens]`, the first from the prefill."""
        if new_tokens < 1 or prompt_ids.shape[1] + new_tokens > self.cache.max_len:
            raise CourseError(f"{prompt_ids.shape[1]} prompt tokens + {new_tokens} new ones do not fit the "
                              f"decoder's {self.cache.max_len} slots.")
        self.prefill(prompt_ids)
        out = [self.token.clone()]
        for _ in range(new_tokens - 1):
            self.step()
            out.append(self.token.clone())
        return torch.cat(out, dim=1)
