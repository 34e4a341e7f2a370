"""Stage 5, notebook 08 (Serving many users): batching, the paged KV cache, prefix caching, and the continuous-batching
engine in nano-vllm's four parts: block manager, scheduler, model runner, sampler."""
