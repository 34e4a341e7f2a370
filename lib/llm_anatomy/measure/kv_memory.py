"""How much memory the KV cache takes, for famous models, long contexts and many users.

Pure functions over a small table of published model shapes, each reduced to the four numbers the
formula needs (`llm_anatomy.model.kv_cache.kv_bytes`). The widget in widgets/kv_calculator.py is a thin
shell over `kv_report`.

Units: bytes, and GiB = 2**30 bytes. GPUs are sold as "80 GB" and hold about 80 GiB (85.9e9 bytes), so memory
is counted in GiB here. A server cannot give all of it to KV caches: the CUDA context, activations and the
allocator's reserve keep some back (vLLM uses 90% of the memory by default).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch

from ..device import DTYPES, dtype_named  # noqa: F401  (DTYPES: the calculator's choices)
from ..errors import CourseError
from ..model.kv_cache import kv_bytes

GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that fix its KV cache (from the model's published config.json)."""

    name: str
    attention: str  # "MHA", "GQA" or "MQA"
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    parameters: float  # total parameters, for the memory the weights take

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        """Bytes of K and V for one token of one sequence."""
        return kv_bytes(self.layers, self.kv_heads, self.head_dim, bytes_per_element)


def _pattern(layers: int, every: int) -> list[str]:
    """Local layers with a global one every `every` layers (the last of each group)."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]


# The one table of published models: the fields of their config.json files (their pages on the Hugging Face hub) that
# set the cache, as transformers normalises them: Gemma 2 and 3 get the `layer_types` that Gemma2Config and
# Gemma3TextConfig build when a file gives none (Gemma 3's older files give `sliding_window_pattern`), and Falcon-7B's
# `multi_query: true` is written as the one KV head that transformers' Falcon attention reads it as. The calculator's
# models also have a parameter count (for the memory the weights take).
LAYOUT_CONFIGS: dict[str, dict] = {
    "SmolLM2-135M": dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576),
    "Llama-2-7B": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=4096),
    "Llama-3-8B": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096),
    "Falcon-7B": dict(num_hidden_layers=32, num_attention_heads=71, num_key_value_heads=1, hidden_size=4544),
    "Llama-2-70B": dict(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, hidden_size=8192),
    "DeepSeek-V3": dict(num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, hidden_size=7168,
                        kv_lora_rank=512, qk_rope_head_dim=64),
    "Mistral-7B-v0.1": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                            sliding_window=4096),
    "Gemma-2-9B": dict(num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8, hidden_size=3584,
                       head_dim=256, sliding_window=4096, layer_types=_pattern(42, 2)),
    "Gemma-3-27B": dict(num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, hidden_size=5376,
                        head_dim=128, sliding_window=1024, layer_types=_pattern(62, 6)),
}
PARAMETERS = {"SmolLM2-135M": 134.5e6, "Llama-2-7B": 6.74e9, "Llama-3-8B": 8.03e9, "Falcon-7B": 7.22e9,
              "Llama-2-70B": 69.0e9}


def _shape(name: str) -> ModelShape:
    c = LAYOUT_CONFIGS[name]
    return ModelShape(name, layout_name(c), layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
                      heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"], parameters=PARAMETERS[name])


# GPU memory, GiB: the label says "GB", and the card holds about that many GiB (a little less is usable).
GPU_MEMORY_GIB: dict[str, float] = {
    "laptop GPU (8 GB)": 8, "T4 (16 GB)": 16, "L4 (24 GB)": 24, "A100 (40 GB)": 40, "A100 (80 GB)": 80,
    "H100 (80 GB)": 80, "H200 (141 GB)": 141,
}


MAX_LENGTH = 10_000_000  # tokens: beyond any model's context today
MAX_USERS = 1_000_000


def model_shape(name: str) -> ModelShape:
    """The shape of a famous model by name (see FAMOUS_MODELS)."""
    if name not in FAMOUS_MODELS:
        raise CourseError(f"Unknown model {name!r}: choose one of {', '.join(FAMOUS_MODELS)}.")
    return FAMOUS_MODELS[name]


def bytes_per_element(dtype: str | torch.dtype) -> int:
    """Bytes of one number: 2 for 'bf16'/'fp16', 4 for 'fp32', 1 for 'fp8'."""
    if isinstance(dtype, str):
        dtype = dtype_named(dtype)
    return torch.tensor([], dtype=dtype).element_size()


def kv_bytes_per_token(name: str, dtype: str = "bf16") -> int:
    """Bytes the KV cache of model `name` needs per token of one sequence."""
    return model_shape(name).kv_bytes_per_token(bytes_per_element(dtype))


def _check_count(value, what: str, largest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise CourseError(f"The {what} must be a whole number, not {value!r}.")
    if value < 1:
        raise CourseError(f"The {what} must be at least 1, not {int(value)}.")
    if value > largest:
        raise CourseError(f"The {what} {int(value):,} is too large: use at most {largest:,}.")
    return int(value)


def _check_memory(gpu_memory_gib) -> float:
    if isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, (int, float)) \
            or not math.isfinite(gpu_memory_gib) or gpu_memory_gib <= 0:
        raise CourseError(f"GPU memory must be a positive number of GiB, not {gpu_memory_gib!r}.")
    if gpu_memory_gib > 100_000:
        raise CourseError(f"{gpu_memory_gib:,} GiB is more memory than any GPU has: use at most 100,000 GiB.")
    return float(gpu_memory_gib)


def users_that_fit(per_user_bytes: int, gpu_memory_gib: float, weight_bytes: int = 0) -> int:
    """How many sequences' KV caches fit in `gpu_memory_gib` after the weights (whole users, 0 if none)."""
    free = _check_memory(gpu_memory_gib) * GIB - weight_bytes
    if free <= 0 or per_user_bytes <= 0:
        return 0
    return int(free // per_user_bytes)


@dataclass(frozen=True)
class KVReport:
    """The calculator's answer. Bytes are exact integers; GiB = 2**30 bytes."""

    model: str
    length: int
    users: int
    dtype: str
    gpu_memory_gib: float
    bytes_per_token: int  # one token of one sequence
    per_user_bytes: int  # one sequence of `length` tokens
    total_bytes: int  # all users
    weight_bytes: int  # the model's weights in the same number format
    users_fit: int  # sequences of `length` that fit beside the weights

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def fits(self) -> bool:
        return self.users <= self.users_fit


def kv_report(model: str, length: int, users: int = 1, dtype: str = "bf16", gpu_memory_gib: float = 80) -> KVReport:
    """KV cache bytes for `users` sequences of `length` tokens of a famous model, and how many fit in a GPU."""
    shape = model_shape(model)
    length = _check_count(length, "sequence length", MAX_LENGTH)
    users = _check_count(users, "number of users", MAX_USERS)
    size = bytes_per_element(dtype)
    memory = _check_memory(gpu_memory_gib)
    per_token = shape.kv_bytes_per_token(size)
    weights = int(shape.parameters * size)
    return KVReport(model, length, users, dtype, memory, per_token, per_token * length, per_token * length * users,
                    weights, users_that_fit(per_token * length, memory, weights))


# ---------------------------------------------------------------------------------------------- from a config dict

def _local(config: dict) -> list[bool]:
    """For each layer, whether it keeps only a sliding window of tokens (a local layer)."""
    layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return [kind == "sliding_attention" for kind in config["layer_types"]]
    windowed = config.get("sliding_window") is not None and config.get("use_sliding_window", True)
    return [bool(windowed)] * layers


def layout_name(config: dict) -> str:
    """The cache layout a config describes: 'MLA', 'hybrid' (local and global layers), 'sliding' (every layer
    local), or by its KV heads 'MHA', 'GQA' or 'MQA'."""
    if config.get("kv_lora_rank"):
        return "MLA"
    local = _local(config)
    if any(local):
        return "sliding" if all(local) else "hybrid"
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    return "MHA" if kv == heads else "MQA" if kv == 1 else "GQA"


def kv_cache_bytes_from_config(config: dict, context: int, bytes_per_element: int) -> int:
    """Bytes of one sequence's KV cache after `context` tokens, from a model's config.json (a dict).

    MLA (DeepSeek; `kv_lora_rank` set): each layer keeps one compressed latent (kv_lora_rank numbers) and one shared
    RoPE key (qk_rope_head_dim numbers) per token, from which K and V are both rebuilt: no factor 2. Otherwise each
    layer keeps a key and a value of num_key_value_heads x head_dim numbers per token (num_key_value_heads missing:
    one per head, MHA; head_dim missing: hidden_size // num_attention_heads), for every token on a global layer and
    for at most `sliding_window` tokens on a local one (`layer_types`: "sliding_attention" or "full_attention" per
    layer; without it, a sliding_window applies to every layer, as in Mistral-7B v0.1).
    """
    layers = config["num_hidden_layers"]
    if config.get("kv_lora_rank"):
        return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_element * context
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    window = config.get("sliding_window")
    held = sum(min(context, window) if local else context for local in _local(config))  # tokens, all layers
    return 2 * kv * head_dim * bytes_per_element * held


FAMOUS_MODELS: dict[str, ModelShape] = {name: _shape(name) for name in PARAMETERS}  # the calculator's


# ---------------------------------------------------------------------------------------------- claim C10, measured

@torch.inference_mode()
def measure_kv_bytes(reference, token_ids: torch.Tensor, lengths, batches, new_cache=None) -> dict:
    """The bytes of keys and values that transformers' model holds in its cache after a prefill, for every
    (tokens, sequences) of lengths x batches: {(tokens, sequences): bytes}, counted on the cache's own tensors.

    token_ids: `[1, >= max(lengths)]`; each prefill feeds its first `tokens` ids, repeated for `sequences` rows.
    new_cache: a function of the model's config giving the cache to fill (default: transformers' DynamicCache, which
    grows as tokens come; a StaticCache, which reserves a maximum length up front, is the world without growth).
    """
    from ..weights.load import transformers_model

    model = transformers_model(reference)
    measured = {}
    for tokens in lengths:
        for sequences in batches:
            ids = token_ids[:, :tokens].expand(sequences, -1)  # [sequences, tokens]
            kwargs = {} if new_cache is None else {_cache_argument(model): new_cache(model.config)}
            out = model(ids, attention_mask=torch.ones_like(ids), use_cache=True, **kwargs)
            cache = getattr(out, "cache", None) or out.past_key_values
            measured[(tokens, sequences)] = sum(t.numel() * t.element_size() for layer in cache.layers
                                                for t in (layer.keys, layer.values))
    return measured


def _cache_argument(model) -> str:
    """The name under which this transformers version takes a cache to fill: `cache` (5.x), else past_key_values."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_kv_bytes(config, measured: dict, dtype: torch.dtype, ours: dict | None = None):
    """Claim C10 on measured cache bytes: {(tokens, sequences): bytes} from `measure_kv_bytes` (and `ours`, the same
    from the course's own cache) must each equal the formula, kv_cache_bytes(config, tokens, sequences, dtype), and
    the measurements must span at least two lengths and two batch sizes, each growing in proportion: the bytes per
    token and sequence are the same at every point (a cache that reserved a maximum length would not grow, and one
    that shared a row between users would not grow with them). Returns the verdict; raises ClaimFailed otherwise."""
    from ..claims import claim
    from ..model.kv_cache import kv_cache_bytes

    points = {("transformers", *k): v for k, v in measured.items()}
    points.update({("ours", *k): v for k, v in (ours or {}).items()})
    formula = {key: kv_cache_bytes(config, key[1], key[2], dtype=dtype) for key in points}
    equal = all(points[key] == formula[key] for key in points)
    per_unit = {points[key] / (key[1] * key[2]) for key in points if key[1] * key[2]}
    lengths = sorted({t for _, t, _ in points})
    batches = sorted({b for _, _, b in points})
    spans = len(lengths) >= 2 and len(batches) >= 2
    rows = "; ".join(f"{who} {t} tokens x {b}: {points[(who, t, b)]:,} (formula {formula[(who, t, b)]:,})"
                     for who, t, b in sorted(points))
    units = ", ".join(f"{u:,.0f}" for u in sorted(per_unit))
    evidence = (f"{rows}. Equal to the formula: {equal}; {len(lengths)} lengths and {len(batches)} batch sizes, the "
                f"bytes per token and sequence the same at every point ({units}): {len(per_unit) == 1}")
    return claim("C10", equal and spans and len(per_unit) == 1, evidence)
