"""Stage 2, notebooks 02-04 and 06 (the model): embeddings, RoPE, attention, the KV cache, the whole model from scratch."""
