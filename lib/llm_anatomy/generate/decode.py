"""Prefill and decode: the course's one decoding loop (claim C8).

    out = prefill(model, prompt_ids, cache)      # the whole prompt in one pass; K and V of every position cached
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    out = decode_step(model, token, cache)       # only the newest token; its K and V are appended

`prefill` and `decode_step` are the two calls every part of the course makes: the generation session
(session.py), the benchmarks, the checks against transformers, speculative decoding (whose verify pass is a
prefill that keeps the logits of every position it feeds) and the notebooks. `generate_greedy` strings them into a
loop (and, with use_cache=False, shows what a model without a cache must do instead: run the whole sequence again
at every step). `left_pad` makes one rectangle of prompts of different lengths, with its attention mask; as in
transformers' generate, the decode loop keeps that mask and extends it by one column of 1 each step (`extend_mask`),
since the padding is the batch's, not the cache's. `StaticDecoder` is the same decode step with fixed shapes, so that
a CUDA graph can record it once and replay it (notebook 07 and the bench): it passes its own positions and mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..device import timed as timed_call
from ..errors import CourseError
from ..model.config import check_context
from ..model.kv_cache import KVCache, KVCacheInterface


@torch.inference_mode()
def prefill(model, prompt_ids: torch.Tensor, cache: KVCacheInterface, *, attention_mask: torch.Tensor | None = None,
            positions: torch.Tensor | None = None, attention_layers=(), logits_to_keep: int = 1,
            check_range: bool = True):
    """Run the prompt `[batch, seq]` (or the next chunk of it) through the model, appending its K and V to `cache`.

    attention_mask `[batch, keys]` (0: padding) and positions `[seq]` or `[batch, seq]`: as in the model's trace.
    Returns the model's output (llm_anatomy.model.scratch.ScratchOutput) with the logits of the last
    `logits_to_keep` positions, `[batch, logits_to_keep, vocab]` (0: every position), and the attention weights of
    `attention_layers`. check_range=False skips reading the ids back to check them (the model's trace): a compiled
    step (fast/compiled.py) feeds only ids the model chose, and a read back would break its graph. A call that fails
    leaves a cache's length as it was, so no half-written position is ever counted.
    """
    return _prefill(model, prompt_ids, cache, attention_mask=attention_mask, positions=positions,
                    attention_layers=attention_layers, logits_to_keep=logits_to_keep, check_range=check_range)


def _prefill(model, prompt_ids, cache, *, attention_mask=None, positions=None, attention_layers=(), logits_to_keep=1,
             check_range=True):
    """prefill's work, without entering inference_mode: a decode_step that torch.compile traces calls it, since
    dynamo cannot trace into inference_mode (the compiled step runs under the caller's; fast/compiled.py)."""
    length_before = getattr(cache, "length", None)  # a view counts no positions: nothing to rewind
    try:
        return model.trace(prompt_ids, cache, attention_mask, positions=positions, keep_hidden=False,
                           attention_layers=attention_layers, logits_to_keep=logits_to_keep, check_range=check_range)
    except Exception:
        if length_before is not None:
            cache.length = length_before
        raise


def decode_step(model, token_ids: torch.Tensor, cache: KVCacheInterface, *, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, attention_layers=(), check_range: bool = True):
    """Feed only the newest token `[batch, 1]`: its K and V are appended to `cache`; logits `[batch, 1, vocab]`.

    attention_mask: a padded batch's mask, extended to this step (extend_mask); positions, check_range: as in
    prefill."""
    if token_ids.dim() != 2 or token_ids.shape[1] != 1:
        raise CourseError(f"A decode step feeds one token per sequence, [batch, 1], not {tuple(token_ids.shape)}.")
    if getattr(cache, "length", None) == 0:
        raise CourseError("The cache is empty: prefill the prompt before the first decode step.")
    run = _prefill if torch.compiler.is_compiling() else prefill  # torch.compile cannot trace into inference_mode
    return run(model, token_ids, cache, attention_mask=attention_mask, positions=positions,
               attention_layers=attention_layers, check_range=check_range)


def extend_mask(attention_mask: torch.Tensor | None, new: int = 1) -> torch.Tensor | None:
    """The mask for the next call, as transformers' generate extends it: `attention_mask` `[batch, keys]` with `new`
    columns of 1 after it (the new tokens are real ones), `[batch, keys + new]`. None (nothing padded) stays None."""
    if attention_mask is None:
        return None
    ones = torch.ones(attention_mask.shape[0], new, dtype=attention_mask.dtype, device=attention_mask.device)
    return torch.cat([attention_mask, ones], dim=1)


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """`attention_mask` when it marks some padding, else None: the decode steps of a batch with no padding then read
    every key without a mask, as the prefill's mask allowed."""
    return None if attention_mask is None or bool(attention_mask.bool().all()) else attention_mask


def left_pad(rows: list[list[int]], pad_id: int = 0, device: torch.device | str | None = None):
    """Prompts of different lengths as one rectangle: ids `[batch, longest]` with the padding in front, and the
    attention mask `[batch, longest]` (1 = token, 0 = padding), the form transformers and our model read.

    The padding goes in front (left) so that every prompt's last token sits in the last column, where decoding
    continues. Which id pads does not matter: the mask hides it.
    """
    if not rows or not all(len(r) for r in rows):
        raise CourseError("left_pad needs at least one prompt, and every prompt needs at least one token.")
    longest = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (longest - len(r)) + list(r) for r in rows], device=device)  # [batch, longest]
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows], device=device)  # [batch, longest]
    return ids, mask


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


def greedy_calls(model, prompt_ids: torch.Tensor, new_tokens: int, *, use_cache: bool = True,
                 cache: KVCache | None = None):
    """Greedy decoding as its model calls, one at a time: a generator of functions, each of which runs the next call
    (the prefill first) and writes the token it picks; when exhausted it returns the tokens `[batch, new_tokens]`.

    `generate_greedy` runs them in order. A timer that compares two generations runs them in turns instead, one call
    of each (measure.timing.time_generations_interleaved), so that a busy moment of the machine hits both alike.
    """
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise CourseError(f"new_tokens must be a whole number, at least 1, not {new_tokens!r}.")
    batch, prompt_len = prompt_ids.shape
    if use_cache and cache is None:
        cache = model.new_cache(batch, prompt_len + new_tokens)
    out = torch.empty(batch, new_tokens, dtype=prompt_ids.dtype, device=prompt_ids.device)  # [batch, new]

    def call(i: int):
        with torch.inference_mode():
            if not use_cache:  # the whole sequence so far, every time
                result = model.trace(torch.cat([prompt_ids, out[:, :i]], dim=1), keep_hidden=False, logits_to_keep=1)
            else:
                result = prefill(model, prompt_ids, cache) if i == 0 else decode_step(model, out[:, i - 1:i], cache)
            out[:, i] = result.logits[:, -1].argmax(-1)

    for i in range(new_tokens):
        yield lambda i=i: call(i)
    return out


def generate_greedy(model, prompt_ids: torch.Tensor, new_tokens: int, *, use_cache: bool = True,
                    cache: KVCache | None = None, timed: bool = False) -> Generation:
    """Greedy decoding with a from-scratch model: `new_tokens` ids per sequence of `prompt_ids` `[batch, seq]`.

    use_cache=True: prefill once, then decode_step with only the newest token.
    use_cache=False: run the whole sequence again at every step (what a model without a cache must do).
    timed=True: record each model call's wall time (the device synchronized around it).
    """
    calls = greedy_calls(model, prompt_ids, new_tokens, use_cache=use_cache, cache=cache)
    seconds: list[float] = []
    while True:
        try:
            call = next(calls)
        except StopIteration as done:
            return Generation(done.value, seconds)
        if timed:
            seconds.append(timed_call(call, prompt_ids.device)[0])
        else:
            call()


def greedy_tokens(model, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Greedy token ids for one prompt `[1, seq]` (prefill once, then one token at a time), cut after the EOS."""
    out = generate_greedy(model, prompt_ids, max_new_tokens).tokens[0].tolist()
    return out[:out.index(eos_token_id) + 1] if eos_token_id in out else out


# --------------------------------------------------------------------------- the fixed-shape step (CUDA graphs)


class SlotWriter(KVCacheInterface):
    """The cache as a fixed-shape step sees it (a KVCacheInterface): the write position is a tensor, `pos`, and
    attention reads every one of the cache's `max_len` slots. The step passes the mask that hides the slots not
    written yet, and the new token's RoPE position: the count of real keys before it (slots 0 .. pos - 1), `pos`.
    """

    def __init__(self, cache: KVCache, pos: torch.Tensor):
        self.cache, self.pos = cache, pos

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.cache.keys[layer].index_copy_(2, self.pos, k)  # new: the slot comes from a tensor, not a Python int
        self.cache.values[layer].index_copy_(2, self.pos, v)
        return self.cache.keys[layer], self.cache.values[layer]  # new: all max_len slots, the mask hides the unwritten

    def advance(self, new: int) -> None:
        self.pos.add_(new)  # new: on the device, so a replayed graph moves it too


class StaticDecoder:
    """`decode_step` with fixed shapes, so that a CUDA graph can record it once and replay it with one launch.

    Eager PyTorch launches each small kernel from Python; for one token of a small model the GPU can wait
    on those launches longer than it computes. A recorded graph replays the kernels alone, so nothing that
    changes from step to step may live in Python. What this adds over decode_step, and why:
    - the position lives in a tensor (`pos`), not a Python int, so the recorded graph stays valid;
    - attention reads all `max_len` slots of the cache (the SlotWriter above), and the step passes a mask that hides
      the slots not yet written, `slots <= pos`, and the position `pos`, both computed on the device inside the step;
    - the step skips reading the token id and its position back to check them: the model chose the id, and the
      decoder refuses at the start a max_len beyond the model's context.
    The forward pass is the model's own: nothing of the model is written twice.
    """

    def __init__(self, model, batch: int, max_len: int):
        check_context(max_len, model.cfg.max_position_embeddings)  # the step reads no position back: refuse it here
        self.model = model
        self.cache = model.new_cache(batch, max_len)
        device = model.device
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # [batch, 1] the newest token
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # where the newest token's K and V go
        self.writer = SlotWriter(self.cache, self.pos)
        self.slots = torch.arange(max_len, device=device)  # [max_len]
        self.graph = None

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Run the prompt through the ordinary prefill (which fills the cache) and keep the first new token."""
        self.cache.reset()
        out = prefill(self.model, prompt_ids, self.cache)
        self.token.copy_(out.logits[:, -1:].argmax(-1))
        self.pos.fill_(prompt_ids.shape[1])

    def _step(self) -> None:
        mask = (self.slots <= self.pos).expand(self.token.shape[0], -1)  # [batch, max_len]: the slots written
        out = self.model.trace(self.token, self.writer, mask, positions=self.pos, keep_hidden=False,
                               logits_to_keep=1, check_range=False)
        self.token.copy_(out.logits[:, -1:].argmax(-1))  # logits [batch, 1, vocab]

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
