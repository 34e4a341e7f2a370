"""LLM Anatomy: the helper library that the course notebooks import.

The package root holds the anatomy, in course order, one idea per file:
    pretokenize  bpe_train  bpe_hf  bpe          text -> tokens (notebook 01)
    embeddings  rope  attention  kv_cache         the maths of one layer (02-03, 06)
    scratch  logit_lens                           the whole model from scratch (04)
    sampling  decode  generation  chat            choosing tokens, prefill and decode (05-06)
Around it, folders named for their layer. Imports point one way only, from left to right:
    errors, device, paths -> maths -> models/, scratch -> decoding -> measure/ -> views/ -> widgets/, exercises/ -> cli/
models/ loads weights (the offline default's cache, hub models, random-weight shapes); measure/ times and
counts; views/ draws (HTML, matplotlib; no ipywidgets); widgets/ are thin ipywidgets shells over one view
and one pure function; exercises/ checks the learners' answers; cli/ is `python -m llm_anatomy`.
tests/test_layers.py checks these rules.
"""

from .device import default_dtype, pick_device
from .errors import CourseError
from .models import DEFAULT_MODEL, LoadedModel, load_model

__version__ = "0.1.0"
__all__ = ["CourseError", "DEFAULT_MODEL", "LoadedModel", "default_dtype", "load_model", "pick_device"]
