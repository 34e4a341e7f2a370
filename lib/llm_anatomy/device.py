"""Choosing where the model runs, in which number format, and how to time work on it.

`timed(fn, device)` is the course's one clock: every timing (the benchmarks, the session's
milliseconds, TTFT and TPOT) goes through it, so that all of them wait for the device the same way.
"""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

import torch

from .errors import CourseError


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """Return the device to use: CUDA first, then Apple's MPS, then the CPU for "auto"."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise CourseError(
            f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'mps'."
        ) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise CourseError("You asked for 'cuda' but this machine has no CUDA GPU: use device='auto'.")
    if chosen.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise CourseError("You asked for 'mps' but Apple's MPS is not available here: use device='auto'.")
    return chosen


def native_bf16(device: torch.device) -> bool:
    """Whether this CUDA GPU computes bf16 in hardware (Ampere and newer), not by emulation.

    A T4 reports bf16 as "supported" through emulation, which is slow and has no bf16 tensor-core
    peak to compare with: there fp16 is the right 16-bit format.
    """
    if device.type != "cuda":
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older torch without the argument: compute capability 8.0 or newer has bf16 units
        return torch.cuda.get_device_capability(device)[0] >= 8


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU (exact, and fast enough); bf16 on GPUs with native bf16, else fp16."""
    if device.type == "cuda":
        return torch.bfloat16 if native_bf16(device) else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def describe_device(device: torch.device) -> str:
    """A one-line, human description such as 'cuda (NVIDIA H100, 80.0 GB)' or 'cpu (2 cores)'."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda ({props.name}, {props.total_memory / 1e9:.1f} GB)"
    if device.type == "mps":
        return "mps (Apple GPU)"
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def synchronize(device: torch.device) -> None:
    """Wait until queued GPU work has finished, so that a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[float, T]:
    """(seconds, result) of one call of `fn`, the device synchronized before and after.

    On a GPU, kernels are queued and run later: without the synchronize, a timer measures only how
    fast Python queues them.
    """
    device = torch.device(device)
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result
