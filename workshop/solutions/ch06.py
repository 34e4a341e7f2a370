"""Solutions to the exercises of notebook 06 (the KV cache)."""

from __future__ import annotations

import torch


def kv_cache_bytes(config: dict, context: int, bytes_per_element: int) -> int:
    """Exercise 6.3: one sequence's KV cache after `context` tokens, from the model's config.json (a dict)."""
    layers = config["num_hidden_layers"]
    if config.get("kv_lora_rank"):  # MLA: one latent and one shared RoPE key per token and layer, no K/V pair
        return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_element * context
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads  # missing: MHA
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_token_and_layer = 2 * kv_heads * head_dim * bytes_per_element  # a key and a value per KV head
    window = config.get("sliding_window")
    if config.get("layer_types"):
        local = [kind == "sliding_attention" for kind in config["layer_types"]]
    else:
        local = [window is not None] * layers
    return sum(per_token_and_layer * (min(context, window) if is_local else context) for is_local in local)


# Exercise 6.4: an "80 GB" GPU holds 80 GiB; the weights take 8.03e9 x 2 bytes; one user's cache is 2**30 bytes
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
