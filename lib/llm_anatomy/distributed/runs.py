"""What each rank does in notebook 10's experiments (and in `python -m llm_anatomy parallel`).

Each function here is a spawn target: `run_ranks(tp_run, 3, cfg, folder, prompt_ids, 48)` calls
`tp_run(rank, 3, cfg, folder, prompt_ids, 48)` in every rank and gives back their results. They live in the library,
not in the notebook, because a spawned process must import the function it runs. A rank reads only its own share of
the checkpoint (safetensors slices), so no rank ever holds the whole model unless it is asked to.
"""

from __future__ import annotations

import copy

import torch

from ..device import choose_cpu_threads, timed, torch_threads
from ..generate.decode import decode_step, generate_greedy, prefill
from .collectives import time_all_reduce
from .launch import rank_device
from .pipeline import pipeline_stage, run_stage
from ..weights.load import checkpoint_name
from .tensor_parallel import (Communicator, checkpoint_reader, reader_for, tensor_parallel_llama,
                              weight_bytes)


def tp_run(rank: int, world_size: int, cfg, folder: str, prompt_ids: torch.Tensor, new_tokens: int,
           with_transformers: bool = False, transformers_tokens: int = 0) -> dict:
    """One rank of a TP group of world_size: its shard, the prompt's logits, greedy tokens, collectives, bytes.

    Returns logits `[1, seq, vocab]` (rank 0 only: every rank has the same ones), tokens `[1, new_tokens]`, the
    forward's collectives [(op, site, bytes)], the collectives of the whole generation, the rank's weight bytes and
    KV-cache bytes, and with_transformers: the comparison with transformers' own tp_plan="auto" (compare_with_transformers,
    with transformers_tokens greedy tokens of theirs).
    """
    import torch.distributed as dist

    device = rank_device(rank)
    comm = Communicator(dist.group.WORLD)
    model = tensor_parallel_llama(checkpoint_reader(folder), cfg, rank, world_size, comm, device=device)
    ids = prompt_ids.to(device)
    logits = model(ids)  # [1, seq, vocab]: all of the vocabulary, gathered
    forward = [(c.op, c.site, c.bytes) for c in comm.calls]
    comm.reset()
    tokens = generate_greedy(model, ids, new_tokens).tokens  # prefill, then one decode step per token
    out = {"rank": rank, "tokens": tokens.cpu(), "forward_calls": forward, "generation_calls": len(comm.calls),
           "weight_bytes": weight_bytes(model), "kv_bytes": model.new_cache(1, ids.shape[1] + new_tokens).allocated_bytes(),
           "shapes": {name: tuple(p.shape) for name, p in model.named_parameters() if name.startswith(("layers.0.", "embed"))},
           "logits": logits.cpu() if rank == 0 else None}
    if with_transformers:
        out["transformers"] = compare_with_transformers(model, folder, ids, logits, transformers_tokens)
    return out


def compare_with_transformers(model, folder: str, ids: torch.Tensor, logits: torch.Tensor, new_tokens: int = 0) -> dict:
    """Inside a rank: load transformers' own tensor-parallel model (tp_plan="auto") into the running group, and
    compare each of its weights' local shard (`to_local()` of the DTensor) with ours, and its logits with ours.

    Returns {"weights": how many compared, "equal": how many equal bit for bit, "different": their names,
    "max_logit_difference": ..., "scale": the largest |logit|, "tokens": their `new_tokens` greedy tokens or None}.
    """
    import warnings

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():  # 5.x asks for DistributedConfig(tp_plan=...); tp_plan= is the documented way
        warnings.simplefilter("ignore", FutureWarning)
        theirs = AutoModelForCausalLM.from_pretrained(folder, tp_plan="auto", dtype=model.dtype)
    state = theirs.state_dict()
    different = []
    names = [name for name, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        weight = state[checkpoint_name(name)]
        local = weight.to_local() if hasattr(weight, "to_local") else weight  # this rank's shard of their DTensor
        if local.shape != param.shape or not torch.equal(local.to(param.device), param.detach()):
            different.append(name)
    with torch.inference_mode():
        their_logits = theirs(ids).logits
        tokens = None
        if new_tokens:  # greedy, and no stop token: exactly new_tokens of them, like generate_greedy
            settings = copy.deepcopy(theirs.generation_config)
            settings.eos_token_id, settings.do_sample, settings.max_new_tokens, settings.pad_token_id = None, False, \
                new_tokens, 0
            settings.temperature = settings.top_p = settings.top_k = None
            tokens = theirs.generate(ids, attention_mask=torch.ones_like(ids), generation_config=settings)
            tokens = tokens[:, ids.shape[1]:].cpu()
    return {"weights": len(names), "equal": len(names) - len(different), "different": different,
            "max_logit_difference": (their_logits.float() - logits.float()).abs().max().item(),
            "scale": logits.abs().max().item(), "tokens": tokens}


def cost_run(rank: int, world_size: int, cfg, folder, sizes: list[int], repeats: int, steps: int,
             prompt_len: int = 16) -> dict:
    """One rank of the cost measurement: the all-reduce sweep, then decode steps in turns: rank 0 alone (TP = 1, on
    one thread and on the cores free when it starts), rank 0's own shard alone (its compute, no collective), and the
    TP group, each collective timed. folder: the weights, a folder of safetensors or tensor_parallel.RandomWeights.

    Returns {"cores": the free cores it found (device.choose_cpu_threads; 1 on a GPU), "sweep": {bytes: [seconds]},
    "alone_s", "alone_all_cores_s", "shard_s" (rank 0; else []), "tp_s": [seconds],
    "inside_s": [seconds spent inside collectives, per step], "last_step": [(op, site, bytes, seconds)]}.
    """
    import torch.distributed as dist

    device = rank_device(rank)
    read = reader_for(folder)
    comm = Communicator(dist.group.WORLD, timing=True)
    model = tensor_parallel_llama(read, cfg, rank, world_size, comm, device=device)
    alone = tensor_parallel_llama(read, cfg, 0, 1, Communicator(), device=device) if rank == 0 else None
    shard = tensor_parallel_llama(read, cfg, 0, world_size, Communicator(), device=device) if rank == 0 else None
    sweep = time_all_reduce(sizes, repeats, device=device)
    prompt = torch.arange(3, 3 + prompt_len, device=device)[None]  # [1, prompt_len]: the values do not matter
    token = prompt[:, -1:]  # [1, 1]
    cache = model.new_cache(1, prompt_len + steps + 2)
    prefill(model, prompt, cache)
    if alone is not None:
        cache_alone = alone.new_cache(1, prompt_len + 2 * steps + 3)
        prefill(alone, prompt, cache_alone)
        cache_shard = shard.new_cache(1, prompt_len + steps + 2)
        prefill(shard, prompt, cache_shard)
    dist.barrier()  # every rank ready: the others now wait at the loop's barrier while rank 0 measures
    cores = choose_cpu_threads().threads if device.type == "cpu" and rank == 0 else 1  # the cores free now
    alone_s, all_cores_s, shard_s, tp_s, inside_s = [], [], [], [], []
    for step in range(steps + 1):  # the first step of each warms up and is not kept
        if alone is not None:  # the others wait at the barrier meanwhile, leaving the machine to rank 0
            one = timed(lambda: decode_step(alone, token, cache_alone), device)[0]
            mine = timed(lambda: decode_step(shard, token, cache_shard), device)[0]
            with torch_threads(cores):
                many = timed(lambda: decode_step(alone, token, cache_alone), device)[0]
            if step:
                alone_s.append(one)
                shard_s.append(mine)
                all_cores_s.append(many)
        dist.barrier()
        comm.reset()
        seconds = timed(lambda: decode_step(model, token, cache), device)[0]
        if step:
            tp_s.append(seconds)
            inside_s.append(sum(c.seconds for c in comm.calls))
        dist.barrier()
    return {"rank": rank, "cores": cores, "sweep": sweep, "alone_s": alone_s, "alone_all_cores_s": all_cores_s,
            "shard_s": shard_s, "tp_s": tp_s, "inside_s": inside_s,
            "last_step": [(c.op, c.site, c.bytes, c.seconds) for c in comm.calls]}


def pipeline_run(rank: int, world_size: int, cfg, folder, prompt_ids: torch.Tensor, micro_batch_counts: list[int],
                 repeats: int, cpus=None, serial: bool = False, compare: bool = True) -> dict:
    """One stage (rank = stage) of a pipeline of world_size stages.

    First (with compare) the whole batch `prompt_ids` as one micro-batch, keeping every position's logits (to compare
    with one process); then, `repeats` times in rotation, the batch cut into each count of `micro_batch_counts`, with
    the last position's logits only (what a prefill needs). folder: the weights, a folder of safetensors or
    tensor_parallel.RandomWeights. cpus: the CPU cores this rank may run on (None: any; {0} for every rank: the
    counterfactual of stages that cannot overlap). serial: run_stage's counterfactual engine. Returns {"logits":
    [batch, seq, vocab] (the last stage), "runs": {m: [segments of each repeat]}} where segments are run_stage's.
    """
    import os

    import torch.distributed as dist

    if cpus:
        os.sched_setaffinity(0, cpus)
    device = rank_device(rank)
    model = pipeline_stage(reader_for(folder), cfg, rank, world_size, device=device)
    ids = prompt_ids.to(device)
    batch, seq = ids.shape

    def run(m: int, last_only: bool):
        parts = list(ids.chunk(m, dim=0))  # m micro-batches of batch / m sequences
        shapes = [(p.shape[0], seq, cfg.hidden_size) for p in parts]
        dist.barrier()  # every stage starts its clock together
        return run_stage(model, parts if rank == 0 else m, shapes, last_only, serial)

    outputs = run(1, last_only=False)[0] if compare else []
    runs: dict[int, list] = {m: [] for m in micro_batch_counts}
    run(max(micro_batch_counts), last_only=True)  # warm-up at the smallest micro-batch
    for _ in range(repeats):
        for m in micro_batch_counts:
            runs[m].append(run(m, last_only=True)[1])
    return {"rank": rank, "logits": outputs[0].cpu() if outputs else None, "runs": runs}
