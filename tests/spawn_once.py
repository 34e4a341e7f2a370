"""Distributed experiments spawned once per test session: the same target, number of ranks and inputs (compared by
value) give back the first run's results, as copies, to whichever test asks next. Starting ranks and loading the
model in each is most of a run's time; `python -m llm_anatomy parallel --quick` (tests/cli/test_parallel.py) and
tests/distributed/test_runs.py ask for the same pipeline and cost runs. A run that fails is not kept."""

from __future__ import annotations

import copy
import hashlib

import torch

from llm_anatomy.distributed import launch

_run_ranks = launch.run_ranks  # the real launcher, even while a test stands this function in for it
_done: dict = {}


def _fingerprint(value):
    """A value, comparable by content: tensors by dtype, shape and bytes, numbers by value, the rest by repr."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("tensor", str(value.dtype), tuple(value.shape), hashlib.sha256(data).hexdigest())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_fingerprint(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _fingerprint(v)) for k, v in value.items())))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return ("number", float(value))  # timeout_s=60 from a test, 60.0 from the command line's parser
    return (type(value).__name__, repr(value))


def spawn_once(target, world_size: int, *args, **kwargs) -> list:
    """run_ranks(target, world_size, *args, **kwargs), spawned the first time these arguments are seen."""
    key = (f"{target.__module__}.{target.__qualname__}", world_size, _fingerprint(args), _fingerprint(kwargs))
    if key not in _done:
        _done[key] = _run_ranks(target, world_size, *args, **kwargs)
    return copy.deepcopy(_done[key])  # each test gets its own: none can change what another reads
