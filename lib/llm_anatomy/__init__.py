"""LLM Anatomy: the library that the course notebooks import. Its folders are the course's stages, in order:

    ground      errors device paths claims texts     what every stage stands on (texts: every text the course reads)
    weights/    cache parse_once load random         the model's files: fetched, checked, converted, loaded
    tokens/     pretokenize bpe_train bpe_hf bpe     01 Tokens
    model/      embeddings rope attention explore    02 Embeddings and positions, 03 Attention (explore: the explorer's data)
                config scratch ablations logit_lens  04 The forward pass (config: the one reader of model configs)
                kv_cache                             06 The KV cache (and KVCacheInterface: a cache stores and attends)
    generate/   sampling decode session steps chat   05 Generation, 06 (the one decoding loop: prefill, decode_step)
    measure/    timing peaks roofline overhead ...   07 Prefill and decode, and what every later stage measures with:
                exactness stats quality                 the checks against transformers, chi-squared, quality losses
    serve/      batching paged_kv prefix_cache ...   08 Serving many users (paged_attention block_manager scheduler
                                                        model_runner sampler selective flat_step metrics cost load)
    fast/       gguf_blocks quantize packed ...      09 Making decode fast (speculative sampling_check tiled_attention
                                                        fused)
    distributed/ tensor_parallel pipeline ...    10 Beyond one device (collectives launch runs)
    constrained/ automaton schema mask generate  12 Output you can parse (evidence)
    server/     app engine schemas metrics ...     11 Behind the API (sizing launch client evidence)
    views/      HTML and matplotlib pictures of every stage (no ipywidgets)
    widgets/    thin ipywidgets shells over one view and one pure function
    exercises/  the checks of every notebook's exercises (chNN.py)
    cli/        `python -m llm_anatomy fetch|doctor|check|bench|parallel|serve`

Imports point down this list only (tests/test_layers.py ranks the folders and checks every import). Each stage's
`__init__.py` names its notebook and re-exports nothing: an import says where a thing lives.
"""

from .device import default_dtype, pick_device
from .errors import CourseError
from .weights.cache import DEFAULT_MODEL
from .weights.load import LoadedModel, load_model

__version__ = "0.1.0"
__all__ = ["CourseError", "DEFAULT_MODEL", "LoadedModel", "default_dtype", "load_model", "pick_device"]
