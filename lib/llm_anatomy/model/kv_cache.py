"""The KV cache: keys and values of every past position, kept so decode never recomputes them.

One preallocated tensor per layer for keys and one for values, `[batch, kv_heads, max_len, head_dim]`,
and a length: how many positions are filled. Each forward pass writes its new positions at
`length` in every layer, then advances `length` once.

What the model asks of a cache has a name, `KVCacheInterface`: store the new keys and values, let attention read
them, count them as cached. This contiguous KVCache implements it, and so do the paged caches of notebook 08
(serve/paged_kv.py), the fixed slots that a CUDA graph replays (generate/decode.py), and the flattened batches that
lay a whole batch end to end in one row (serve/selective.py, serve/flat_step.py). Where each new token sits (its RoPE
position) and which keys it may read (the attention mask) are not the cache's business: whoever builds the batch
passes them to the model, as transformers' generate passes position_ids and attention_mask. A padded batch's mask
grows by a column of 1 per decode step (generate/decode.py, extend_mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import torch

from .config import attention_layout
from ..errors import CourseError


class KVCacheInterface:
    """What ScratchLlama asks of a cache in one forward pass, wherever the keys and values live.

    batch_size: the sequences it holds, one per row of the input.
    update(layer, k, v): in each layer, store the new keys and values `[batch, kv_heads, new, head_dim]` and give back
        every key and value attention reads, `[batch, kv_heads, keys, head_dim]`.
    attend(layer, q, k, v, kernel): where attention meets the cache: by default store the new k and v (update), then
        run `kernel` (the layer's attention, masks included) over what the cache holds; a cache that lays its rows out
        another way replaces it (serve/selective.py and serve/flat_step.py put a whole batch end to end in one row).
        Returns (out, weights or None).
    advance(new): after the last layer, count the new positions as cached.

    The positions and the key mask are the batch builder's, passed to the model with the tokens. A cache that keeps
    one honest count of its positions (KVCache, paged_kv.PagedSequenceCache) has a `length` too: the model then
    places new tokens after it when no positions are given, and prefill and the speculative verify pass rewind it
    after a failure or a rejected draft (`cache.length = n`).
    """

    batch_size: int  # an attribute or a property

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def advance(self, new: int) -> None:
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel):
        return kernel(q, *self.update(layer, k, v))


def rope_positions(key_mask: torch.Tensor | None, past: int, new: int, device) -> torch.Tensor:
    """RoPE positions of `new` tokens after `past`: `[new]`, or `[batch, new]` when a mask `[batch, past + new]`
    (False: padding) says where the padding is: a token's position is the count of real tokens before it, as
    transformers' generate computes position_ids from attention_mask."""
    if key_mask is None:
        return torch.arange(past, past + new, device=device)
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]


@dataclass
class KVCache(KVCacheInterface):
    """The contiguous cache (a KVCacheInterface): every sequence reserves `max_len` positions up front."""

    keys: list[torch.Tensor]  # per layer: [batch, kv_heads, max_len, head_dim]
    values: list[torch.Tensor]  # per layer: [batch, kv_heads, max_len, head_dim]
    length: int = 0  # positions filled so far

    @classmethod
    def allocate(cls, num_layers: int, batch_size: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> "KVCache":
        """An empty cache with room for `max_len` positions in each of `num_layers` layers."""
        if batch_size < 1 or max_len < 1:
            raise CourseError(f"A KV cache needs batch_size >= 1 and max_len >= 1, not {batch_size} and {max_len}.")
        shape = (batch_size, kv_heads, max_len, head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(keys, values, 0)

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

    def used_bytes(self) -> int:
        """Bytes of keys and values for the filled positions, all layers."""
        per_position = sum(t[:, :, :1].numel() * t.element_size() for t in self.keys + self.values)
        return per_position * self.length

    def allocated_bytes(self) -> int:
        """Bytes reserved for keys and values, filled or not."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def written_positions(self) -> int:
        """How many positions hold a key and a value in EVERY layer, for every sequence (some entry not zero), read
        from the stored tensors themselves, not from `length`: a prefill that advanced the length without writing, or
        wrote only some layers, shows fewer. (The cache starts as zeros; a real key or value is never all zeros.)"""
        written = None
        for t in self.keys + self.values:  # [batch, kv_heads, max_len, head_dim]
            here = t.ne(0).any(dim=-1).any(dim=1).all(dim=0)  # [max_len]
            written = here if written is None else written & here
        return int(written.sum())


def kv_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int, seq_len: int = 1,
             batch_size: int = 1) -> int:
    """Bytes of a KV cache: 2 (K and V) x layers x kv_heads x head_dim x bytes per number x seq_len x batch.

    SmolLM2-135M in bf16: 2 x 30 x 3 x 64 x 2 = 23,040 bytes per token.
    """
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("bytes_per_element", bytes_per_element), ("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CourseError(f"{name} must be a whole number >= 0, not {value!r}.")
    return 2 * layers * kv_heads * head_dim * bytes_per_element * seq_len * batch_size


# --------------------------------------------------------------------------- reading a transformers config


def kv_layout(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder config: what one position of the KV cache holds per K and V.

    A Llama-family config (it names num_key_value_heads) is read as ScratchConfig.from_hf reads it (config.py, the
    course's one config reader); other families by their own names: GPT-2 (n_layer, n_head) and Falcon
    (num_kv_heads, multi_query, new_decoder_architecture). MHA: kv_heads == heads; GQA: fewer; MQA: one.
    """
    if getattr(config, "num_key_value_heads", None) is not None:
        layers, _, kv_heads, head_dim = attention_layout(config)
        return layers, kv_heads, head_dim
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
    """`kv_bytes` for a transformers decoder config (or an object with the same attribute names).

    MHA, GQA and MQA are covered (see kv_layout); head_dim defaults to hidden_size // heads.
    """
    if isinstance(seq_len, bool) or isinstance(batch_size, bool) or seq_len < 0 or batch_size < 0:
        raise CourseError("seq_len and batch_size must be zero or more.")
    layers, kv_heads, head_dim = kv_layout(config)
    bytes_per = torch.tensor([], dtype=dtype).element_size()
    return kv_bytes(layers, kv_heads, head_dim, bytes_per, int(seq_len), int(batch_size))


def _first(config, *names, default=KeyError):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is KeyError:
        raise CourseError(f"The config has none of {names}: is it a decoder language model?")
    return default


# --------------------------------------------------------------------------- claim C7: the check notebook 06 runs


@torch.inference_mode()
def transformers_prefill_kv(reference, prompt_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values transformers' own model stores in its DynamicCache after a prefill of `prompt_ids`
    `[batch, seq]`: one (keys, values) pair per layer, each `[batch, kv_heads, seq, head_dim]`, RoPE applied to the
    keys (as ours). reference: a transformers causal LM or the course's LoadedModel; it knows nothing of our cache."""
    from ..weights.load import transformers_model

    model = transformers_model(reference)
    out = model(prompt_ids, attention_mask=torch.ones_like(prompt_ids), use_cache=True)
    theirs = getattr(out, "cache", None) or out.past_key_values
    return [(layer.keys, layer.values) for layer in theirs.layers]


def prefill_tolerance(dtype: torch.dtype) -> float:
    """How far a stored K or V vector may sit from transformers' (relative, per position): fp32 rounding, or 16-bit."""
    return 1e-4 if dtype == torch.float32 else 5e-2


def check_prefill_cache(cache: KVCache, theirs: list, prompt_tokens: int, bytes_expected: int, *,
                        tolerance: float | None = None):
    """Claim C7 after a prefill of `prompt_tokens` tokens: the cache's length is the prompt's, its bytes are
    `bytes_expected` (the formula's), and in EVERY layer, for K and for V, EVERY prompt position holds the vector
    transformers' DynamicCache holds there (`theirs`, from transformers_prefill_kv), within `tolerance` of its size.

    The distance is measured position by position, |ours - theirs| / |theirs| over the batch, heads and head_dim, so one
    missing or zeroed position in one layer counts in full (1.0), not diluted by the others. Returns the verdict.
    """
    from ..claims import claim

    n = prompt_tokens
    tolerance = prefill_tolerance(cache.keys[0].dtype) if tolerance is None else tolerance
    worst, where, shapes_ok = 0.0, "", len(theirs) == len(cache.keys)
    for layer, (their_k, their_v) in enumerate(theirs[:len(cache.keys)]):
        for name, ours, ref in (("K", cache.keys[layer], their_k), ("V", cache.values[layer], their_v)):
            ours = ours[:, :, :n].float()
            ref = ref.float().to(ours.device)
            if ours.shape != ref.shape:
                shapes_ok, worst = False, math.inf
                where = f"layer {layer} {name}: {tuple(ours.shape)} against {tuple(ref.shape)}"
                continue
            per_position = ((ours - ref).square().sum((0, 1, 3)).sqrt()
                            / ref.square().sum((0, 1, 3)).sqrt().clamp_min(1e-30))  # [n]
            if float(per_position.max()) > worst:
                worst, position = float(per_position.max()), int(per_position.argmax())
                where = f"layer {layer} {name}, position {position}"
    used = cache.used_bytes()
    k_shape = tuple(cache.keys[0][:, :, :n].shape)
    evidence = (f"after prefilling {n} tokens: length {cache.length}, keys and values {k_shape} in each of "
                f"{len(cache.keys)} layers, {used:,} bytes (the formula: {bytes_expected:,}); every layer's K and V at "
                f"every position against transformers' DynamicCache: at most {worst:.1e} of their size ({where}), "
                f"within {tolerance:g}: {worst <= tolerance}")
    return claim("C7", cache.length == n and used == bytes_expected and shapes_ok and worst <= tolerance, evidence)
