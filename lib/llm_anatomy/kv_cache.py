"""The KV cache: keys and values of every past position, kept so decode never recomputes them.

One preallocated tensor per layer for keys and one for values, `[batch, kv_heads, max_len, head_dim]`,
and a length: how many positions are filled. Each forward pass writes its new positions at
`length` in every layer, then advances `length` once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .errors import CourseError


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer: [batch, kv_heads, max_len, head_dim]
    values: list[torch.Tensor]  # per layer: [batch, kv_heads, max_len, head_dim]
    length: int = 0  # positions filled so far
    pad_mask: torch.Tensor | None = field(default=None)  # [batch, max_len] bool, False = padding
    padded: bool = False  # whether pad_mask holds any padding: decode steps then skip reading it

    @classmethod
    def allocate(cls, num_layers: int, batch_size: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> "KVCache":
        """An empty cache with room for `max_len` positions in each of `num_layers` layers."""
        if batch_size < 1 or max_len < 1:
            raise CourseError(f"A KV cache needs batch_size >= 1 and max_len >= 1, not {batch_size} and {max_len}.")
        shape = (batch_size, kv_heads, max_len, head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        pad_mask = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)
        return cls(keys, values, 0, pad_mask)

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `k`, `v` `[batch, kv_heads, new, head_dim]` at position `length` of `layer`.

        Returns the keys and values of all positions so far, `[batch, kv_heads, length + new, head_dim]`
        (views into the cache, no copy). Call advance(new) once after the last layer.
        """
        new = k.shape[2]
        end = self.length + new
        if end > self.max_len:
            raise CourseError(f"The KV cache is full: it holds {self.max_len} positions and this step needs {end}. "
                              "Allocate a bigger one with new_cache(batch_size, max_len).")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, new: int) -> None:
        """Mark `new` more positions as filled (after every layer has written them)."""
        self.length += new

    def reset(self) -> None:
        """Forget every position (the memory stays allocated)."""
        self.length = 0
        self.padded = False
        if self.pad_mask is not None:
            self.pad_mask.fill_(True)

    def used_bytes(self) -> int:
        """Bytes of keys and values for the filled positions, all layers."""
        per_position = sum(t[:, :, :1].numel() * t.element_size() for t in self.keys + self.values)
        return per_position * self.length

    def allocated_bytes(self) -> int:
        """Bytes reserved for keys and values, filled or not."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


def kv_layout(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder config: what one position of the KV cache holds per K and V.

    Reads transformers' names for Llama-family models (num_key_value_heads), GPT-2 (n_layer, n_head)
    and Falcon (num_kv_heads, multi_query, new_decoder_architecture). MHA: kv_heads == heads;
    GQA: fewer; MQA: one.
    """
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head")
    if getattr(config, "model_type", None) == "falcon" or hasattr(config, "new_decoder_architecture"):
        # Falcon's config keeps num_kv_heads == heads even for its multi-query models: the flags decide.
        if getattr(config, "new_decoder_architecture", False):
            kv_heads = config.num_kv_heads
        else:
            kv_heads = 1 if getattr(config, "multi_query", False) else heads
    else:
        kv_heads = _first(config, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=None)
        if kv_heads is None:
            kv_heads = 1 if getattr(config, "multi_query", False) else heads
    head_dim = _first(config, "head_dim", default=None) or _first(config, "hidden_size", "n_embd") // heads
    return int(layers), int(kv_heads), int(head_dim)


def kv_cache_bytes(config, seq_len: int, batch_size: int = 1, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of a KV cache: 2 (K and V) x layers x kv_heads x head_dim x seq_len x batch x bytes per number.

    `config` is any transformers decoder config (or an object with the same attribute names).
    MHA, GQA and MQA are covered (see kv_layout); head_dim defaults to hidden_size // heads.
    """
    if isinstance(seq_len, bool) or isinstance(batch_size, bool) or seq_len < 0 or batch_size < 0:
        raise CourseError("seq_len and batch_size must be zero or more.")
    layers, kv_heads, head_dim = kv_layout(config)
    bytes_per = torch.tensor([], dtype=dtype).element_size()
    return 2 * layers * kv_heads * head_dim * int(seq_len) * int(batch_size) * bytes_per


# --------------------------------------------------------------------------- generating with and without it


@dataclass
class Generation:
    """What a greedy generation gives back.

    tokens: `[batch, new_tokens]` the generated ids; step_seconds: wall-clock seconds of each forward pass
    (the first is the prefill, so step_seconds[0] is the time to first token); empty unless timed.
    """

    tokens: torch.Tensor
    step_seconds: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        """Time to first token, seconds (the prefill)."""
        return self.step_seconds[0]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first, seconds (median of the decode steps)."""
        rest = sorted(self.step_seconds[1:])
        if not rest:
            raise CourseError("Time per output token needs at least 2 new tokens.")
        return rest[len(rest) // 2]


@torch.inference_mode()
def generate_greedy(model, prompt_ids: torch.Tensor, new_tokens: int, *, use_cache: bool = True,
                    cache: KVCache | None = None, timed: bool = False) -> Generation:
    """Greedy decoding with a from-scratch model (`model(ids, cache) -> logits [batch, seq, vocab]`).

    use_cache=True: prefill the prompt once, then feed only the newest token each step, appending its K and V.
    use_cache=False: run the whole sequence again at every step (what a model without a cache must do).
    timed=True: synchronize the device around each step and record its wall-clock seconds.
    """
    if new_tokens < 1:
        raise CourseError(f"new_tokens must be at least 1, not {new_tokens}.")
    from .device import synchronize

    device = prompt_ids.device
    batch, prompt_len = prompt_ids.shape
    if use_cache and cache is None:
        cache = model.new_cache(batch, prompt_len + new_tokens)
    out = torch.empty(batch, new_tokens, dtype=prompt_ids.dtype, device=device)  # [batch, new] preallocated
    seq = prompt_ids
    times: list[float] = []
    step_input = prompt_ids
    for i in range(new_tokens):
        if timed:
            synchronize(device)
            start = time.perf_counter()
        logits = model(step_input, cache, logits_to_keep=1) if use_cache else model(seq, logits_to_keep=1)
        next_id = logits[:, -1].argmax(-1)  # [batch]
        out[:, i] = next_id
        if timed:
            synchronize(device)
            times.append(time.perf_counter() - start)
        if use_cache:
            step_input = out[:, i:i + 1]
        elif i + 1 < new_tokens:
            seq = torch.cat([seq, out[:, i:i + 1]], dim=1)
    return Generation(out, times)


def _first(config, *names, default=KeyError):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is KeyError:
        raise CourseError(f"The config has none of {names}: is it a decoder language model?")
    return default
