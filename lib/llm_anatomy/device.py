"""Choosing where the model runs, and in which number format."""

from __future__ import annotations

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


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU (exact, and fast enough); bf16 on GPUs that support it, else fp16."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
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
    import os

    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def synchronize(device: torch.device) -> None:
    """Wait until queued GPU work has finished, so that a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
