"""Two watches over torch's calls, for the checks that judge how an answer computes (not only what).

`torch_calls`: every torch function the block calls, C code's calls included, is handed to `seen(func, args, kwargs,
out)` after it ran. Chapter checks build their counters on it: products and choices (2.2), the K a product read (3.3).
`aten_made`: every tensor an ATen op of the block allocated, whichever torch function (or operator, or composite
such as torch.matmul broadcasting) ran it: the copies a check refuses (3.3's K, 6.2's stored positions) are found by
what they hold and how big they are, not by the name of the call that made them."""

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


@contextlib.contextmanager
def aten_made(seen):
    """While the block runs, every tensor that an ATen op allocated (an output that is no view of its inputs) goes
    to `seen(tensor)`, after the op ran. An in-place write allocates nothing: a buffer filled later shows as the
    buffer, when it was made (a check that cares what it ends up holding keeps it and looks again at the end)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def storage(t):
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own holds no copy
            return None

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            inputs = {storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and storage(t) not in inputs:  # views share their input's storage
                    seen(t)
            return out

    with Made():
        yield
