"""The model's numbers, read once from a transformers config: the course's one config reader.

`ScratchConfig.from_hf(config)` reads a Llama-family config (Llama, SmolLM2, Qwen2, Mistral, ...), or a dict with
the same field names (such as weights/random.py's shapes). Everything that needs a layer count, a head count or a
head size (the from-scratch model, the KV-cache formula, the diagrams, the roofline's work counts) asks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace

from ..errors import CourseError


@dataclass
class ScratchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool = True
    rope_type: str = "default"  # "default" is plain RoPE; others scale it (Llama 3's "llama3", "linear", ...)

    @classmethod
    def from_hf(cls, config) -> "ScratchConfig":
        """Read the numbers we need from a transformers Llama-family config (or a dict of its fields)."""
        if isinstance(config, Mapping):
            config = SimpleNamespace(**config)
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        layers, heads, kv_heads, head_dim = attention_layout(config)
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   intermediate_size=config.intermediate_size, num_layers=layers, num_heads=heads,
                   num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=float(theta), rms_norm_eps=config.rms_norm_eps,
                   max_position_embeddings=config.max_position_embeddings,
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
                   rope_type=rope.get("rope_type", rope.get("type", "default")) or "default")

    def check_runnable(self) -> None:
        """Refuse, in one sentence, a config the from-scratch model cannot run (it implements plain RoPE)."""
        if self.rope_type != "default":
            raise CourseError(f"This from-scratch model implements plain RoPE, not {self.rope_type!r} scaling.")
        if self.head_dim % 2:
            raise CourseError(f"head_dim must be even for RoPE (it rotates pairs); this config has {self.head_dim}.")

    def check_layer_head(self, layer, head=None, what: str = "") -> None:
        """Refuse, in one sentence, a layer (0 .. layers - 1) or a query head (0 .. heads - 1, or None) this model lacks
        (`what` names the setting they came from, e.g. "attention's ")."""
        for name, value, count in (("layer", layer, self.num_layers), ("head", head, self.num_heads)):
            if (value is not None or name == "layer") and (isinstance(value, bool) or not isinstance(value, int)
                                                           or not 0 <= value < count):
                raise CourseError(f"{what}{name} must be a whole number from 0 to {count - 1}, not {value!r}.")


def attention_layout(config) -> tuple[int, int, int, int]:
    """(layers, heads, kv_heads, head_dim) from a Llama-family config's names, or from any object that has just
    those (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim or hidden_size): all that the KV-cache
    formula needs. kv_heads defaults to heads (multi-head attention), head_dim to hidden_size // heads."""
    if isinstance(config, Mapping):
        config = SimpleNamespace(**config)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, heads, kv_heads, head_dim


def check_context(positions: int, context: int) -> None:
    """Refuse a call that needs more positions than the model's context (the one place this is checked)."""
    if positions > context:
        raise CourseError(f"{positions} positions exceed the model's context of {context} tokens (it reads at most "
                          f"{context}): shorten the prompt or ask for fewer new tokens.")
