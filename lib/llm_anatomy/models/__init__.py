"""Getting a model: the offline default's cache (cache.py), loading (load.py), random-weight shapes (random.py)."""

from .cache import (DEFAULT_MODEL, GGUF_NAME, GGUF_SHA256, GGUF_SIZE, cache_dir, cache_problems, default_model_dir,
                    ensure_gguf, fetch_default_model, sha256_of)
from .load import LoadedModel, load_model, transformers_model, verify_files
from .random import RANDOM_SHAPES, random_llama

__all__ = ["DEFAULT_MODEL", "GGUF_NAME", "GGUF_SHA256", "GGUF_SIZE", "LoadedModel", "RANDOM_SHAPES", "cache_dir",
           "cache_problems", "default_model_dir", "ensure_gguf", "fetch_default_model", "load_model", "random_llama",
           "sha256_of", "transformers_model", "verify_files"]
