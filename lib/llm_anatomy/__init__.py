"""LLM Anatomy: the helper library that the course notebooks import.

Layers (arrows point down only):
    widgets, plots                 -> ipywidgets / matplotlib shells over pure functions
    generation, measure, bench     -> prefill, decode_step, sampling, timing
    scratch model, attention, rope, kv_cache, bpe
    models (loading), device, errors
"""

from .device import default_dtype, pick_device
from .errors import CourseError
from .models import DEFAULT_MODEL, LoadedModel, load_model

__version__ = "0.1.0"
__all__ = ["CourseError", "DEFAULT_MODEL", "LoadedModel", "default_dtype", "load_model", "pick_device"]
