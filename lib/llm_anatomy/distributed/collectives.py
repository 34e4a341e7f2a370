"""What a collective costs (claim C22): a latency plus the bytes over a bandwidth, measured here, then used to predict.

    t(n bytes) = latency + n / bandwidth

`time_all_reduce` (run inside every rank) times one all-reduce per message size, the sizes in rotation so that a
busy moment of the machine slows them all alike; `fit_link` fits that line through the medians. A tensor-parallel
decode step makes a fixed list of collectives (`tp_step_collectives`): `predict_tp_step` adds their cost to the
compute, which TP divides among the ranks. `tp_pays_up_to` is the scaling book's rule for training (compute-bound);
`tp_decode_pays_up_to` its rule for memory-bound generation, and `break_even_latency` the latency floor beside it.
Times in seconds, sizes in bytes, bandwidths in bytes/s.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from ..claims import claim, not_shown
from ..device import timed, usable_cores
from ..errors import CourseError

SWEEP_BYTES = [4, 256, 2304, 16_384, 131_072, 1_048_576, 4_194_304]  # 2,304: one token's hidden state, fp32
# The scaling book ("How to Scale Your Model", section 12, How to Think About GPUs): an H100 computes 990e12 bf16
# FLOP/s; each GPU sends 450e9 bytes/s over NVLink within a node, and a node 400e9 bytes/s to the others: 8 InfiniBand
# NICs (ConnectX-7, 400 Gb/s each), one per GPU, so 50e9 bytes/s per GPU across nodes.
# PCIe Gen5 x16 moves about 64e9 bytes/s each way (PCI-SIG: 32 GT/s per lane x 16 lanes).
H100_FLOPS = 990e12
H100_HBM = 3.35e12  # bytes/s an H100 SXM reads from its memory (NVIDIA's datasheet; the scaling book's GPU chapter)
LINKS = {"NVLink, within an H100 node": 450e9, "InfiniBand, across nodes, per GPU": 50e9, "PCIe Gen5 x16": 64e9}


@dataclass(frozen=True)
class Link:
    """A link's cost model: latency_s per collective, plus bytes / bytes_per_s."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        """The predicted time of one collective of `nbytes` bytes, seconds."""
        return self.latency_s + nbytes / self.bytes_per_s

    @property
    def half_bytes(self) -> float:
        """The message size at which the bytes cost as much as the latency: smaller messages are latency-bound."""
        return self.latency_s * self.bytes_per_s


def spread(times: list[float]) -> float:
    """(slowest - fastest) / median of repeated timings: above about 0.5, the machine was busy while they ran."""
    return (max(times) - min(times)) / statistics.median(times)


def time_all_reduce(sizes: list[int] = SWEEP_BYTES, repeats: int = 15, group=None,
                    device: torch.device | str = "cpu") -> dict[int, list[float]]:
    """Inside a rank: seconds of one fp32 all-reduce of each size (bytes), `repeats` times, the sizes in rotation.

    Every rank must call it with the same arguments. A barrier before each call lines the ranks up, so what is
    timed is the collective itself, not one rank waiting for another to finish its own work.
    """
    import torch.distributed as dist

    buffers = {n: torch.zeros(max(1, n // 4), device=device) for n in sizes}  # [n / 4] fp32 numbers
    for x in buffers.values():  # warm-up: the first call of each size sets up its buffers
        dist.all_reduce(x, group=group)
    seconds: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n, x in buffers.items():
            dist.barrier(group=group)
            seconds[n].append(timed(lambda: dist.all_reduce(x, group=group), device)[0])
    return seconds


def fit_link(seconds_by_size: dict[int, list[float]], pick=statistics.median) -> Link:
    """The line latency + bytes / bandwidth through the median time of each size (errors weighted relative to
    each time, so the small messages, which set the latency, count as much as the large ones).

    pick: which of a size's repeats stands for it: the median, or `min` (the fastest, which a busy machine cannot
    make faster: what the claim's check uses)."""
    sizes = np.array(sorted(seconds_by_size), dtype=float)
    if len(sizes) < 2:
        raise CourseError("Fitting a latency and a bandwidth needs timings of at least two message sizes.")
    t = np.array([pick(seconds_by_size[int(n)]) for n in sizes])
    weight = 1 / t  # relative errors
    design = np.stack([np.ones_like(sizes), sizes], axis=1) * weight[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    if latency <= 0 or per_byte <= 0:  # noise tilted the line: fall back to the two ends of the sweep
        latency = t[0]
        per_byte = max(t[-1] - t[0], 1e-3 * t[-1]) / (sizes[-1] - sizes[0])
    return Link(latency_s=float(latency), bytes_per_s=float(1 / per_byte))


def tp_step_collectives(cfg, tp: int, batch: int = 1, tokens: int = 1, bytes_per_element: int = 4,
                        logits_kept: int = 1) -> list[tuple[str, str, int]]:
    """The collectives of one forward pass of our TP model: (op, site, bytes each rank sends in).

    One all-reduce of the embedding, two per block (after attention, after the MLP), each of batch x tokens x hidden
    numbers; one all-gather of this rank's share of the logits (batch x logits_kept x vocab / TP). TP = 1 needs none.
    """
    if tp == 1:
        return []
    hidden = batch * tokens * cfg.hidden_size * bytes_per_element
    calls = [("all_reduce", "embedding", hidden)]
    for _ in range(cfg.num_layers):
        calls += [("all_reduce", "attention", hidden), ("all_reduce", "mlp", hidden)]
    calls.append(("all_gather", "logits", batch * logits_kept * cfg.vocab_size // tp * bytes_per_element))
    return calls


def predict_tp_step(compute_s: float, tp: int, collectives: list[tuple[str, str, int]], link: Link,
                    cores: int | None = None) -> dict[str, float]:
    """A TP step's predicted seconds: compute_s / TP, plus latency + bytes / bandwidth for every collective.

    compute_s: the step measured on one rank alone (TP = 1). cores: when the ranks share `cores` CPU cores and
    TP > cores, they compute in ceil(TP / cores) turns between two collectives (3 ranks on 2 cores: two compute, then
    the third, while the first two wait inside the collective), so compute_s / TP is taken that many times. None:
    every rank has a device of its own. Returns {"compute_s", "latency_s", "bytes_s", "total_s", "turns"}.
    """
    turns = -(-tp // cores) if cores else 1
    compute = compute_s / tp * turns
    latency = link.latency_s * len(collectives)
    sent = sum(nbytes for _, _, nbytes in collectives) / link.bytes_per_s
    return {"compute_s": compute, "latency_s": latency, "bytes_s": sent, "total_s": compute + latency + sent,
            "turns": turns}


def tp_pays_up_to(mlp_width: int, link_bytes_per_s: float, flops_per_s: float = H100_FLOPS) -> float:
    """The largest TP size whose MLP matmuls still take longer than its collectives' bytes: F x W / C.

    The scaling book's rule for large batches (its section 12): within an H100 node, TP < F / 2200. It ignores the
    latency, which is what a small decode step pays (C22), so it is a ceiling, not a promise.
    """
    return mlp_width * link_bytes_per_s / flops_per_s


def tp_decode_pays_up_to(mlp_width: int, batch: int, link_bytes_per_s: float,
                         hbm_bytes_per_s: float = H100_HBM) -> float:
    """The largest TP size at which a memory-bound decode step's all-reduce bytes still take less time than reading
    the MLP's weights from memory: F / (B x beta), beta = W_hbm / W_link.

    The scaling book's rule for generation (its inference chapter, "All About Transformer Inference": reading the
    MLP's weights costs 2DF / (Y x W_hbm) per device, the all-reduce of B tokens' activations 2BD / W_link). Bytes
    only: the latency of each collective, which a small batch pays in full (C22), is `break_even_latency`'s part.
    """
    if batch < 1 or mlp_width < 1:
        raise CourseError(f"The rule needs a batch of at least 1 token and an MLP width of at least 1, not {batch} "
                          f"and {mlp_width}.")
    return mlp_width * link_bytes_per_s / (batch * hbm_bytes_per_s)


def break_even_latency(weight_bytes: float, layers: int, tp: int, hbm_bytes_per_s: float = H100_HBM) -> float:
    """The latency per all-reduce, seconds, at which TP = tp saves nothing on a memory-bound decode step: reading
    the weights takes weight_bytes / W_hbm on one device and a tp-th of it on each rank, and the step pays 2 x layers
    all-reduces (bytes left out: the rule above covers them). Below it TP shortens the step; above it, lengthens it."""
    if tp < 2:
        raise CourseError(f"TP = {tp} makes no all-reduce, so no latency can cost it anything: ask about TP >= 2.")
    alone = weight_bytes / hbm_bytes_per_s
    return (alone - alone / tp) / (2 * layers)


# --------------------------------------------------------------------------- the checks of claim C22

# A small model for C22 on a CPU: SmolLM2-135M's depth (30 layers: 61 all-reduces a step) and its grouped-query layout,
# at a width that TP = 2 divides (4 query heads, 2 KV heads) and that is small beside a CPU's speed, as SmolLM2-135M is
# beside a GPU's: what TP = 2 saves of its step is less than its collectives' latency.
# At hidden 64 the weights are 7 MB: halving them saves a CPU core well under 0.5 ms, against 61 latencies of at least
# 20 us each (gloo on loopback, the fastest it gets) = 1.2 ms; at hidden 128 the saving (about 1.2 ms idle) came too close.
SMALL_TP2 = dict(vocab_size=4096, hidden_size=64, intermediate_size=192, num_layers=30, num_heads=4, num_kv_heads=2,
                 head_dim=16, rope_theta=1e5, rms_norm_eps=1e-5, max_position_embeddings=1024)
BYTES_MARGIN = 10  # the latency term must be at least 10x the bytes term (measured: hundreds of times, idle and busy)
RATIO_BAND = 2.0  # measured / predicted step within [1/2, 2] where the timing can be shown (a 3.7x miss fails)


def predict_from_shard(alone_s: float, shard_s: float, collectives: list[tuple[str, str, int]], link: Link) -> dict:
    """A TP step's predicted seconds from what was measured: one rank's own shard of the step, timed alone (its
    compute, the per-step overheads that TP does not divide included), plus latency + bytes / bandwidth for every
    collective. alone_s: the whole step on one device (TP = 1); saved_s = alone_s - shard_s is the compute TP divides
    away. Returns {"compute_s", "saved_s", "latency_s", "bytes_s", "total_s", "alone_s"}."""
    latency = link.latency_s * len(collectives)
    sent = sum(nbytes for _, _, nbytes in collectives) / link.bytes_per_s
    return {"compute_s": shard_s, "saved_s": alone_s - shard_s, "latency_s": latency, "bytes_s": sent,
            "total_s": shard_s + latency + sent, "alone_s": alone_s}


def check_latency_bound(predicted: dict, collectives: int, shown: bool, why: str):
    """C22, the prediction: the step's collectives cost their latency, not their bytes (latency term >= BYTES_MARGIN x
    bytes term), and that latency outweighs the compute TP divides away (latency term > saved_s), so TP makes the
    step slower. predicted: predict_from_shard's. A green line, the amber not_shown line, or ClaimFailed.

    shown, why: free_cores_for's verdict, taken from the machine (its cores, affinity and load) BEFORE the ranks ran,
    never from their result. The fitted latency is a link's latency only where each rank had a core of its own: where
    the ranks took turns on the cores, an all-reduce waits for the other rank to be scheduled, and the "latency" is
    the OS's time slice (0.19-0.23 ms measured on this 2-core machine at load 11-12; gloo on loopback, with a core per
    rank, gets down to some 0.02 ms, SMALL_TP2's comment). Then the cell says not shown, with the numbers, never "holds".

    What the claim asserts, and what it does not: latency >> bytes and latency > the compute TP saves, i.e. the
    collectives, by their latency, are why TP makes a small model's decode step slower. It does not assert that the
    latency is most (or any fixed share) of the step: the share is printed, not asserted. A share threshold was
    considered and rejected: a fast link (gloo on an idle many-core CPU, or NCCL between 2 GPUs: tens of microseconds an
    all-reduce, against a shard's step of some 1,200 small ops or kernels) leaves the latency a fifth of the step or
    less while the claim, as worded, is true there (TP is still slower, and for this reason); a share test would turn
    that true world red. The worlds that make the claim false are the bytes winning (no latency, or messages
    miscounted large) and the saved compute winning (a wide model): those fail here (tests/distributed/
    test_collectives.py)."""
    latency, sent, saved = predicted["latency_s"], predicted["bytes_s"], predicted["saved_s"]
    total, shard = predicted["total_s"], predicted["compute_s"]
    share = latency / total if total > 0 else 0.0
    sets = "the collectives' latency" if latency >= shard else "the shard's own compute"
    numbers = (f"the step's {collectives} collectives: latency {latency * 1e3:.2f} ms against their bytes "
               f"{sent * 1e3:.3f} ms ({latency / max(sent, 1e-12):,.0f}x) and against the compute TP divides away "
               f"{saved * 1e3:.2f} ms (one device {predicted['alone_s'] * 1e3:.2f} ms, one rank's shard "
               f"{shard * 1e3:.2f} ms)")
    if not shown:
        return not_shown("C22", f"{why}: the ranks took turns on the cores, so the fitted all-reduce latency is the "
                                f"operating system sharing them, not a link ({numbers})",
                         "a machine with at least 3 free CPU cores (2 ranks + this kernel), or 2 GPUs (NCCL)")
    return claim("C22", latency >= BYTES_MARGIN * sent and latency > saved,
                 f"{numbers}: the latency, not bytes, is what the collectives cost, and more than TP saves, so TP is "
                 f"slower; the latency is {share:.0%} of the predicted step, the larger part of it {sets} ({why})")


def free_cores_for(ranks: int, gpus: int = 0) -> tuple[bool, str]:
    """(whether every rank has a device of its own, and why): a GPU each (NCCL), or on the CPU at least ranks + 1
    usable cores (this process's affinity and quota) left free by the load average: one per rank, one for this
    notebook's kernel and the system. Otherwise the ranks' timings measure the OS sharing cores, not the link."""
    if gpus >= ranks:
        return True, f"{gpus} GPUs for {ranks} ranks"
    cores = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = cores - load
    why = f"{cores} usable CPU core(s), load average {load:.1f}: {max(free, 0):.1f} free for {ranks} ranks + this kernel"
    return free >= ranks + 1, why


def check_step_prediction(measured_s: float, predicted: dict, ranks: int, shown: bool, why: str):
    """C22, the measurement: the TP step measured within a factor RATIO_BAND of predict_from_shard's prediction (a
    ratio, measured / predicted). shown: free_cores_for's verdict; where False, the amber not_shown line (with the
    numbers, which then measure the OS sharing cores), never "holds". A green line, the amber line, or ClaimFailed."""
    ratio = measured_s / predicted["total_s"]
    numbers = (f"TP = {ranks} step measured {measured_s * 1e3:.2f} ms, predicted {predicted['total_s'] * 1e3:.2f} ms: "
               f"measured / predicted {ratio:.2f}")
    if not shown:
        return not_shown("C22", f"{why}; the ranks took turns on the cores ({numbers})",
                         f"a machine with at least {ranks + 1} free CPU cores ({ranks} ranks + this kernel), or "
                         f"{ranks} GPUs (NCCL)")
    return claim("C22", 1 / RATIO_BAND <= ratio <= RATIO_BAND, f"{numbers}, within {RATIO_BAND:g}x ({why})")
