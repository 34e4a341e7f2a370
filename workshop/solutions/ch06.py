"""Solutions to the exercises of notebook 06 (the KV cache)."""

from __future__ import annotations


def kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    """Exercise 6.1: K and V, in every layer, for every KV head, head_dim numbers each."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


# Exercise 6.2: 524,288 / 8,192
mqa_saving = 524_288 // 8_192

# Exercise 6.3: (80e9 - 16.06e9) // (131_072 * 8_192)
users_that_fit = int((80e9 - 8.03e9 * 2) // (131_072 * 8_192))
