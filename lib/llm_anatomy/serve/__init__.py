"""Stage 5, notebook 08 (Serving many users): batching, the paged KV cache, prefix caching, the continuous-batching scheduler."""
