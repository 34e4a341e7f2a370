"""Converting the GGUF without parsing it three times: one conversion's caches for two of gguf's functions.

transformers' GGUF loader builds a fresh `gguf.GGUFReader` for the config, again for the tokenizer and again for the
weights (each parses every metadata field, the tokenizer's 49,152 tokens and 48,900 merges one by one), and builds
`gguf.get_tensor_name_map(arch, layers)` once per module of the model (about 400 times). Both are pure functions of
their arguments and the objects they return are only read, so within one conversion each is made once. The loader
imports them from `gguf` when it is called, which is where the cached versions sit, for the conversion only.
"""

from __future__ import annotations

import contextlib
import functools


@contextlib.contextmanager
def parsed_once():
    """Within the block, `gguf.GGUFReader(path)` and `gguf.get_tensor_name_map(arch, n)` return the first object
    made for the same arguments; both are restored afterwards (also on an error)."""
    import gguf

    originals = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}
    readers = {}

    def reader(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = originals["GGUFReader"](path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    gguf.get_tensor_name_map = functools.cache(originals["get_tensor_name_map"])
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(gguf, name, original)
