"""One watch over torch's calls, for the checks that judge how an answer computes (not only what): every torch
function the block calls, C code's calls included, is handed to `seen(func, args, kwargs, out)` after it ran.
Chapter checks build their counters on it: products and choices (2.2), the K a product read (3.3), what cat and
clone made (6.2)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def torch_calls(seen):
    """While the block runs, every torch function call goes to `seen(func, args, kwargs, out)` once it returned."""
    from torch.overrides import TorchFunctionMode

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen(func, args, kwargs or {}, out)
            return out

    with Watching():
        yield
