"""Peak memory of one piece of work: what it allocated beyond what existed before it started, bytes.

On a CUDA GPU the allocator counts it (`torch.cuda.max_memory_allocated`). On a CPU, PyTorch keeps no
such counter, so we ask its profiler, which records every allocation and free with the running total,
and take the highest total. Both count tensors that PyTorch allocates, not Python objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from ..device import synchronize


def peak_tensor_bytes(fn, device: torch.device | str = "cpu") -> int:
    """The most bytes of tensors that `fn()` held at once beyond those alive before the call."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with _quiet(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    totals = [e["args"].get("Total Allocated", 0) for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    return int(max([0] + totals))  # the profiler's running total starts at 0 when profiling starts


@contextlib.contextmanager
def _quiet():
    """Silence what the profiler's C++ side prints on start and stop (it writes to the process's own stdout)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = []
    try:
        with open(os.devnull, "w") as devnull:
            for fd in (1, 2):
                saved.append((fd, os.dup(fd)))
                os.dup2(devnull.fileno(), fd)
            yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
