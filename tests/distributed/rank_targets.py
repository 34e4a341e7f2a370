"""Spawn targets for the launcher's tests: a spawned rank imports the function it runs, so they live in a module."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def echo(rank: int, world_size: int, value):
    """Every rank gives back who it is, the value it was given, and a tensor."""
    return {"rank": rank, "world_size": world_size, "value": value, "tensor": torch.full((2,), float(rank))}


def summed(rank: int, world_size: int):
    """An all-reduce across the group: 1 + 2 + ... + world_size on every rank."""
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    return x.item()


def echo_and_sum(rank: int, world_size: int, value):
    """echo's answer, and summed's all-reduce in the same group (one group for the tests of both)."""
    return dict(echo(rank, world_size, value), summed=summed(rank, world_size))


def fails(rank: int, world_size: int, bad_rank: int):
    """bad_rank raises; the others wait for it in a collective that never completes."""
    if rank == bad_rank:
        raise ValueError(f"rank {rank} was told to fail")
    dist.barrier()
    return rank


def stalls(rank: int, world_size: int):
    """Every rank joins, then sleeps far beyond any deadline a test sets (the launcher must stop it)."""
    time.sleep(3600)


def transformers_forward(rank: int, world_size: int, folder: str):
    """transformers' own tensor-parallel model (tp_plan="auto") in this group: its first forward pass."""
    import warnings

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = AutoModelForCausalLM.from_pretrained(folder, tp_plan="auto", dtype=torch.float32)
    with torch.inference_mode():
        return tuple(model(torch.tensor([[1, 2, 3]])).logits.shape)
