"""Solutions to the exercises of notebook 06 (the KV cache)."""

from __future__ import annotations

import torch


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    """Exercise 6.3: K and V, in every layer, for every KV head, head_dim numbers each."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


# Exercise 6.4: 524,288 / 8,192
mqa_saving = 524_288 // 8_192

# Exercise 6.5: an "80 GB" GPU holds 80 GiB; the weights take 8.03e9 x 2 bytes; one user's cache is 2**30 bytes
users_that_fit = int((80 * 2**30 - 8.03e9 * 2) // (131_072 * 8_192))


def generate_with_cache(model, ids: torch.Tensor, max_new_tokens: int, stop_ids) -> tuple[list[int], str]:
    """Exercise 6.1: prefill once, then feed only the newest token, until a stop id or the length limit."""
    cache = model.new_cache(1, ids.shape[1] + max_new_tokens)  # [batch, kv_heads, max_len, head_dim] per layer
    logits = model(ids, cache)  # prefill: K and V of every prompt position go into the cache
    new = []
    for i in range(max_new_tokens):
        next_id = logits[:, -1:].argmax(-1)  # [1, 1]
        new.append(int(next_id))
        if int(next_id) in stop_ids:
            return new, "stop"
        if i < max_new_tokens - 1:  # the last token need not be fed
            logits = model(next_id, cache)  # only the newest token; its K and V are appended
    return new, "length"


def update(self, layer, k, v):
    """Exercise 6.2: KVCache.update: write the new positions at `length`, return a view of all filled ones."""
    end = self.length + k.shape[2]
    self.keys[layer][:, :, self.length:end] = k
    self.values[layer][:, :, self.length:end] = v
    return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]
