"""Pipeline parallelism (claim C23): the layers cut into stages, each stage's hidden state sent on to the next.

Stage s of p holds layers s x L/p to (s + 1) x L/p - 1; the first stage also holds the embedding, the last the
final norm and the LM head. A stage cannot start a micro-batch before the stage before it has sent its hidden state
`[batch, seq, hidden]`, so with one batch all but one stage are idle at any moment. Cut the batch into m
micro-batches and stage s works on micro-batch i while stage s + 1 works on i - 1: of the time between the first
stage's start and the last stage's end, each stage idles (p - 1) / (m + p - 1) (the bubble), for stages of equal time.

A stage is the plain ScratchLlama built with L/p layers and the stage's weights, the parts it does not run swapped
for nn.Identity (as picotron does); `stage_forward` is the model's own forward pass. Times in seconds.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch
from torch import nn

from ..claims import claim, not_shown
from ..device import timed
from ..errors import CourseError
from ..model.scratch import ScratchConfig, ScratchLlama


def check_stages(cfg: ScratchConfig, stages) -> None:
    """Refuse a stage count that does not cut the layers into equal parts, in one sentence."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise CourseError(f"The number of pipeline stages must be a whole number, at least 1, not {stages!r}.")
    if cfg.num_layers % stages:
        fits = [n for n in range(1, cfg.num_layers + 1) if cfg.num_layers % n == 0]
        raise CourseError(f"{stages} stages do not cut this model's {cfg.num_layers} layers into equal parts: choose "
                          f"a number of stages from {fits}.")


def stage_layers(cfg: ScratchConfig, stage: int, stages: int) -> range:
    """The layers (of the whole model) that stage `stage` holds."""
    check_stages(cfg, stages)
    per = cfg.num_layers // stages
    return range(stage * per, (stage + 1) * per)


def pipeline_stage(read, cfg: ScratchConfig, stage: int, stages: int, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> ScratchLlama:
    """Stage `stage`'s model: the plain ScratchLlama with its L/p layers, their weights read by `read` (see
    tensor_parallel.checkpoint_reader). As picotron builds a stage, what the stage does not run is an nn.Identity:
    the embedding on every stage but the first, the final norm and the LM head on every stage but the last. So the
    model's own forward pass runs the stage, and a middle stage holds no vocabulary-sized matrix."""
    layers = stage_layers(cfg, stage, stages)
    first, last = stage == 0, stage == stages - 1
    with torch.device("meta"):
        model = ScratchLlama(replace(cfg, num_layers=len(layers)))
    if not first:
        model.embed_tokens = nn.Identity()
    if not last:
        model.norm, model.lm_head = nn.Identity(), nn.Identity()
    weights = {}
    for name, _ in model.named_parameters():
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            source = f"layers.{layers[int(index)]}.{rest}"  # this stage's block i is the model's block first + i
        elif name == "lm_head.weight" and cfg.tie_word_embeddings:
            source = "embed_tokens.weight"  # the last stage's own copy of the tied matrix
        else:
            source = name
        weights[name] = read(source).to(device=device, dtype=dtype)
    model.load_state_dict(weights, strict=False, assign=True)
    if cfg.tie_word_embeddings and first and last:
        model.lm_head.weight = model.embed_tokens.weight
    model.stage, model.stages = stage, stages
    return model.eval()


@torch.inference_mode()
def stage_forward(model: ScratchLlama, x: torch.Tensor, last_only: bool = False) -> torch.Tensor:
    """One stage's work: token ids `[batch, seq]` into the first stage, its hidden state `[batch, seq, hidden]` into
    the others; out of the last stage come the logits `[batch, seq, vocab]` (the last position's only with last_only),
    out of the others the hidden state to send on (their LM head is an nn.Identity). No KV cache: a prefill."""
    ids, hidden = (x, None) if model.stage == 0 else (None, x)
    keep = 1 if last_only and model.stage == model.stages - 1 else 0
    return model.trace(ids, inputs_embeds=hidden, keep_hidden=False, logits_to_keep=keep).logits


def run_stage(model: ScratchLlama, micro_batches: list[torch.Tensor] | int, hidden_shapes: list[tuple],
              last_only: bool = False, serial: bool = False) -> tuple[list[torch.Tensor], list[tuple]]:
    """Inside a rank: run this stage over every micro-batch in order (a forward-only GPipe schedule).

    micro_batches: the token ids of each micro-batch on the first stage, their number elsewhere. hidden_shapes: the
    shape of the hidden state each micro-batch brings. Rank r is stage r: it receives from r - 1, sends to r + 1.
    serial: the counterfactual engine that does not overlap: the first stage starts a micro-batch only when the last
    stage has finished the one before. Returns (the last stage's logits per micro-batch, else []) and the segments it
    spent, in order: ("wait", i, s, cpu) for waiting on micro-batch i's hidden state, ("compute", i, s, cpu) for its
    work on it; s: wall seconds, cpu: seconds this thread ran on a core (time.thread_time: a core shared with another
    program or stage gives wall time, not CPU time).
    """
    import time

    import torch.distributed as dist

    first, last = model.stage == 0, model.stage == model.stages - 1
    count = len(micro_batches) if first else micro_batches
    outputs, segments, sends = [], [], []
    done = torch.zeros(1)
    for i in range(count):
        if first:
            x = micro_batches[i]
            if serial and i and model.stages > 1:  # the counterfactual: wait for the last stage to finish micro-batch i - 1
                cpu = time.thread_time()
                segments.append(("wait", i, timed(lambda: dist.recv(done, src=model.stages - 1))[0],
                                 time.thread_time() - cpu))
        else:
            x = torch.empty(hidden_shapes[i], dtype=model.dtype, device=model.device)  # [batch, seq, hidden]
            cpu = time.thread_time()
            segments.append(("wait", i, timed(lambda: dist.recv(x, src=model.stage - 1), x.device)[0],
                             time.thread_time() - cpu))
        cpu = time.thread_time()
        seconds, y = timed(lambda: stage_forward(model, x, last_only), model.device)
        segments.append(("compute", i, seconds, time.thread_time() - cpu))
        if last:
            outputs.append(y)
            if serial and not first and i < count - 1:
                dist.send(done, dst=0)
        else:
            sends.append((dist.isend(y.contiguous(), dst=model.stage + 1), y))  # keep y alive until it is sent
    for work, _ in sends:
        work.wait()
    return outputs, segments


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The share of time each stage idles in a pipeline of equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def makespan_fraction(stages: int, micro_batches: int) -> float:
    """The makespan of m micro-batches over that of one batch, for p equal stages that cost nothing per micro-batch:
    (m + p - 1) / (p x m). Each micro-batch spends 1/(p x m) of the one batch's time in each stage, and the last one
    leaves the last stage m + p - 1 such slots after the first one started. m = 1 gives 1: a pipeline never makes an
    unsplit batch (or one decoding sequence) faster than one device, it only lets micro-batches overlap."""
    if stages < 1 or micro_batches < 1:
        raise CourseError(f"A pipeline needs at least 1 stage and 1 micro-batch, not {stages} and {micro_batches}.")
    return (micro_batches + stages - 1) / (stages * micro_batches)


def timeline(segments: list[tuple]) -> list[tuple[str, int, float, float]]:
    """A rank's segments laid end to end from the barrier that started it: (kind, micro-batch, start, end)."""
    out, now = [], 0.0
    for kind, i, seconds, *_ in segments:
        out.append((kind, i, now, now + seconds))
        now += seconds
    return out


def makespan(segments_by_stage: list[list[tuple]]) -> float:
    """Seconds from the barrier that started the stages to the last stage's end (wall time)."""
    return max(sum(seg[2] for seg in segments) for segments in segments_by_stage)


def measured_bubble(segments_by_stage: list[list[tuple]]) -> float:
    """1 - (a stage's compute time, wall) / (first start to last end), averaged over the stages. Stages that share
    a core count the other's turns as their own compute: cpu_bubble does not."""
    busy = [sum(seg[2] for seg in segments if seg[0] == "compute") for segments in segments_by_stage]
    return 1 - statistics.mean(busy) / makespan(segments_by_stage)


def stage_cpu(segments: list[tuple]) -> float:
    """CPU seconds a stage computed (segments with a 4th element, cpu, as run_stage gives)."""
    return sum(seg[3] for seg in segments if seg[0] == "compute")


def cpu_bubble(segments_by_stage: list[list[tuple]]) -> float:
    """1 - (a stage's CPU seconds of compute) / makespan, averaged over the stages: the share of the time a stage did
    not compute on a core. On one core for all stages it is at least 1 - 1/p, whatever the micro-batches."""
    return 1 - statistics.mean(stage_cpu(segments) for segments in segments_by_stage) / makespan(segments_by_stage)


def schedule(compute_s: list[list[float]]) -> list[tuple[int, int, float, float]]:
    """The calibrated schedule: (stage, micro-batch, start, end) when stage s spends compute_s[s][i] on micro-batch i.

    A stage starts micro-batch i once it has finished i - 1 and the stage before has finished i (sending is free).
    """
    ends: dict[tuple[int, int], float] = {}
    out = []
    for s, row in enumerate(compute_s):
        for i, seconds in enumerate(row):
            start = max(ends.get((s, i - 1), 0.0), ends.get((s - 1, i), 0.0))
            ends[s, i] = start + seconds
            out.append((s, i, start, start + seconds))
    return out


def schedule_bubble(compute_s: list[list[float]]) -> float:
    """The bubble of the calibrated schedule (1 - mean busy / makespan)."""
    makespan = max(end for *_, end in schedule(compute_s))
    return 1 - statistics.mean(sum(row) for row in compute_s) / makespan


PARALLEL = 1.1  # with micro-batches the stages must compute > 1.1 cores' worth per second of the makespan (one core: <= 1)
ALONE_SHARE = 0.8  # a stage computing alone (m = 1) must run >= 80% of its wall time on a core: a free core each
# Reasoned from the run's arithmetic, since this machine was never idle while it was measured (2 stages, 4 micro-batches
# of 128 tokens; each stage's CPU work 1.04-1.12x at m = 4 from re-reading its weights, measured at load 7-11): idle,
# 2.3 / 1.44 = 1.6 cores' worth; one core burned by another program, the stages get 2/3 of a core each while both run:
# 1.23; both stages pinned to one core, or run one after another: <= 1.0 by definition. Measured here at load 7-11 (no
# free core): a stage alone ran 27-49% of its time on a core, so the check said not shown, true world and pinned alike.


def parallelism(segments_by_stage: list[list[tuple]]) -> float:
    """The stages' CPU seconds of compute, summed, over the makespan: how many cores' worth they computed at once
    (at most 1 on one core, and at most 1 when the stages take turns; up to p with p stages each on a core)."""
    return sum(stage_cpu(segments) for segments in segments_by_stage) / makespan(segments_by_stage)


def check_micro_batches_fill(runs: dict[int, list[list[list[tuple]]]], stages: int):
    """C23: micro-batches fill the bubble. runs: {m: [each repeat: [each stage's segments]]}, m = 1 among them.

    With the fastest repeat of each m, asserts that the most micro-batches finish the batch sooner than one batch
    (makespan) and that their stages computed more than PARALLEL cores' worth at once (parallelism): what no single
    core, and no engine that runs its micro-batches one after another through all stages, can do. Where a stage
    computing alone (m = 1) ran less than ALONE_SHARE of its wall time on a core, the machine had no free core per
    stage, or where a stage ran less than ALONE_SHARE of its compute time on a core while the stages computed together
    (the most micro-batches: other programs held the second core, or the stages were pinned to one): the amber
    not_shown line. A green line, the amber line, or ClaimFailed."""
    if 1 not in runs or len(runs) < 2:
        raise CourseError("check_micro_batches_fill needs the runs of one batch (m = 1) and of more micro-batches.")
    most = max(runs)
    fastest = {m: min(reps, key=makespan) for m, reps in runs.items()}
    span = {m: makespan(run) for m, run in fastest.items()}
    cores = {m: parallelism(run) for m, run in fastest.items()}
    def on_core(run):  # the least share of its compute's wall time that a stage ran on a core
        return min(stage_cpu(segments) / max(sum(seg[2] for seg in segments if seg[0] == "compute"), 1e-12)
                   for segments in run)

    # The gate: each stage had a core of its own both when computing alone (m = 1) and while the stages computed
    # together (the most micro-batches). The second half was added after a run of notebook 10 on this shared 2-core
    # machine (other programs at load 2-3) failed C23 where a lone stage got its core but the two stages did not get
    # two: that world cannot be told from stages pinned to one core, so both are not shown, never failed. A pipeline
    # that runs its micro-batches one after another keeps each stage on its core (share ~1) and still fails.
    share = min(on_core(fastest[1]), on_core(fastest[most]))
    numbers = "; ".join(f"m = {m}: makespan {span[m] * 1e3:.0f} ms, {cores[m]:.2f} cores' worth at once"
                        for m in sorted(span))
    if share < ALONE_SHARE:
        return not_shown("C23", f"a stage ran on a core only {share:.0%} of its compute time (alone, or beside the "
                                f"other stage): this machine had no free core per stage ({numbers})",
                         f"a machine with a free core for each of the {stages} stages (idle, with {stages} cores or "
                         "more), or a GPU per stage")
    return claim("C23", span[most] < span[1] and cores[most] > PARALLEL,
                 f"{numbers}: {most} micro-batches finish the batch in {span[most] / span[1]:.2f}x one batch's time, "
                 f"the stages computing at once (more than {PARALLEL:g} cores' worth)")
