"""Exercise 10.6 of notebook 10: the GPipe stage loop, micro-batches through the stages tick by tick, as
pipeline.schedule times them, built by the learner over stages that record what they are given.

The check cuts small random models into 2 to 4 stages with the library's pipeline_stage, compares the learner's
outputs with the stages run one after another and its ticks with pipeline.schedule (refused while the learner's code
runs), for 1 to 6 micro-batches.
"""

from __future__ import annotations

import random

import torch

from . import call, exercise, expect, forbidden_all, hints, returned

class _Stage:
    """Stage `s` as the learner's loop calls it: the library's stage forward, each call recorded (stage,
    micro-batch), the micro-batch told by what came in (its ids for stage 0, the hidden state the stage before sent)."""

    def __init__(self, s, stages, model, micro_batches, produced, log):
        self.s, self.stages, self.model = s, stages, model
        self.micro_batches, self.produced, self.log = micro_batches, produced, log

    def __call__(self, x):
        from ..distributed.pipeline import stage_forward

        s = self.s
        expect(isinstance(x, torch.Tensor), f"stage {s} takes a tensor, not {type(x).__name__}.")
        sent = [i for i, mb in enumerate(self.micro_batches) if x.shape == mb.shape and torch.equal(x, mb)]
        if s == 0:
            expect(bool(sent), "stage 0 takes a micro-batch's token ids, as they are in micro_batches.")
            i = sent[0]
        else:
            expect(not sent, f"stage {s} was given micro-batch {sent[0] if sent else 0}'s token ids: every stage but "
                             "the first takes the hidden state the stage before it sent.")
            came = [i for (t, i), y in self.produced.items() if t == s - 1 and x.shape == y.shape and torch.equal(x, y)]
            expect(bool(came), f"stage {s} was given a tensor that stage {s - 1} has not sent yet (or never): feed "
                               f"stage {s} what stage {s - 1} returned for the same micro-batch, once it has run.")
            i = came[0]
        expect((s, i) not in self.produced, f"stage {s} ran micro-batch {i} twice.")
        y = stage_forward(self.model, x)
        self.produced[s, i] = y
        self.log.append((s, i))
        return y


def _tiny_pipeline(stages: int, seed: int):
    from ..distributed.pipeline import pipeline_stage
    from ..distributed.tensor_parallel import RandomWeights
    from ..model.config import ScratchConfig

    cfg = ScratchConfig(61, 16, 32, 2 * stages, 4, 2, 4, 10000.0, 1e-5, 64)
    read = RandomWeights(cfg, seed).reader()
    return cfg, [pipeline_stage(read, cfg, s, stages) for s in range(stages)]


def _ticks(ticks, stages: int, count: int) -> dict:
    """The learner's ticks as {(stage, micro-batch): tick}, or a line that says what to return."""
    expect(isinstance(ticks, (list, tuple)), f"return the ticks as a list of lists of (stage, micro_batch) pairs, "
                                             f"not {type(ticks).__name__}.")
    at = {}
    for t, work in enumerate(ticks):
        expect(isinstance(work, (list, tuple, set)), f"tick {t} should be a list of (stage, micro_batch) pairs, not "
                                                     f"{type(work).__name__}.")
        expect(len(work) > 0, f"tick {t} is empty: a GPipe forward has no tick where every stage waits.")
        busy = set()
        for pair in work:
            s, i = returned(pair, "pair", f"each entry of tick {t}, (stage, micro_batch)")
            s, i = returned(s, "whole", "a stage"), returned(i, "whole", "a micro-batch")
            expect(0 <= s < stages and 0 <= i < count, f"tick {t}: ({s}, {i}) is not a (stage, micro-batch) of "
                                                       f"{stages} stages and {count} micro-batches.")
            expect(s not in busy, f"tick {t}: stage {s} works on two micro-batches at once; a stage (one rank, one "
                                  "device) works on one at a time.")
            expect((s, i) not in at, f"stage {s} works on micro-batch {i} at ticks {at.get((s, i))} and {t}: once is "
                                     "enough.")
            busy.add(s)
            at[s, i] = t
    return at


@exercise
@hints("At a given moment, which micro-batch can each stage be working on, given what the stage before it has "
       "already sent?",
       "Count in ticks: in one tick every stage that has work does one micro-batch at once, and what a stage returns "
       "reaches the next stage for the next tick. Stage s can work on micro-batch i at tick s + i: the pipeline "
       "fills for p - 1 ticks, runs full, and drains, m + p - 1 ticks in all.",
       "for t in range(m + p - 1): work = [(s, t - s) for s in range(p) if 0 <= t - s < m]; run each: "
       "sent[s, i] = stages[s](micro_batches[i] if s == 0 else sent[s - 1, i]); append work to ticks. "
       "Return [sent[p - 1, i] for i in range(m)], ticks")
def check_gpipe_loop(gpipe) -> str:
    """Exercise 10.6: gpipe(stages, micro_batches) -> (the last stage's output of each micro-batch, in order; the
    ticks: a list, each tick the list of (stage, micro_batch) pairs that work in it)."""
    from ..distributed import pipeline

    expect(callable(gpipe), "define gpipe(stages, micro_batches), returning (outputs, ticks).")
    rng = random.Random(1006)
    cases = [(2, 4), (3, 2), (rng.choice((3, 4)), rng.randint(3, 6)), (2, 1)]
    for stages, count in cases:
        cfg, models = _tiny_pipeline(stages, seed=stages * 10 + count)
        g = torch.Generator().manual_seed(stages * 100 + count)
        micro_batches = [torch.randint(0, cfg.vocab_size, (rng.randint(1, 2), rng.randint(3, 6)), generator=g)
                         for _ in range(count)]
        want = []
        for mb in micro_batches:  # the library's stages, one after another: each micro-batch's logits
            x = mb
            for model in models:
                x = pipeline.stage_forward(model, x)
            want.append(x)
        produced, log = {}, []
        wrapped = [_Stage(s, stages, models[s], micro_batches, produced, log) for s in range(stages)]
        where = f"{count} micro-batch{'es' if count > 1 else ''} through {stages} stages"
        with forbidden_all([(pipeline, "schedule"), (pipeline, "run_stage")], "count the ticks yourself"):
            got = call(gpipe, list(wrapped), [mb.clone() for mb in micro_batches])
        outputs, ticks = returned(got, "pair", "(outputs, ticks)")
        expect(isinstance(outputs, (list, tuple)) and not isinstance(outputs, torch.Tensor),
               f"{where}: return the outputs as a list, one tensor per micro-batch, not {type(outputs).__name__}.")
        missing = [(s, i) for s in range(stages) for i in range(count) if (s, i) not in produced]
        expect(not missing, f"{where}: stage {missing[0][0] if missing else 0} never ran micro-batch "
                            f"{missing[0][1] if missing else 0}: every micro-batch goes through every stage.")
        expect(len(outputs) == count, f"{where}: {len(outputs)} outputs; return one per micro-batch, {count}.")
        for i, out in enumerate(outputs):
            out = returned(out, "tensor", f"micro-batch {i}'s output")
            if not (out.shape == want[i].shape and torch.equal(out, want[i])):
                other = [j for j in range(count) if out.shape == want[j].shape and torch.equal(out, want[j])]
                expect(not other, f"{where}: outputs[{i}] is micro-batch {other[0] if other else 0}'s: return them "
                                  "in the order of the micro-batches.")
                expect(False, f"{where}: outputs[{i}] should be the last stage's output for micro-batch {i}, the "
                              "logits the stages give one after another.")
        at = _ticks(ticks, stages, count)
        expect(len(at) == stages * count, f"{where}: your ticks name {len(at)} pieces of work; there are "
                                          f"{stages * count}, each stage on each micro-batch.")
        for s in range(stages):
            for i in range(count):
                expect(s == 0 or at[s - 1, i] < at[s, i],
                       f"{where}: stage {s} works on micro-batch {i} at tick {at[s, i]}, but stage {s - 1} sends it "
                       f"only at the end of tick {at.get((s - 1, i))}.")
                expect(i == 0 or at[s, i - 1] < at[s, i], f"{where}: stage {s} takes micro-batch {i} before "
                                                          f"{i - 1}: a stage takes them in order.")
        order = [at[work] for work in log]
        expect(order == sorted(order), f"{where}: your loop ran the stages in another order than your ticks say "
                                       f"(it ran {log[:6]}...): run tick by tick, all of a tick's work before the "
                                       "next tick's.")
        right = {(s, i): start for s, i, start, _ in pipeline.schedule([[1.0] * count for _ in range(stages)])}
        if any(at[key] != round(start) for key, start in right.items()):
            expect(len(ticks) != stages * count or count == 1,
                   f"{where}: {len(ticks)} ticks, one micro-batch through all the stages at a time. Stage 0 can "
                   "start the next micro-batch as soon as it has sent one: the stages work at once, "
                   f"{count} + {stages} - 1 = {count + stages - 1} ticks.")
            late = min((key for key in right if at[key] != round(right[key])), key=lambda k: right[k])
            expect(False, f"{where}: stage {late[0]} could work on micro-batch {late[1]} at tick "
                          f"{round(right[late])} (stage {late[0] - 1} has sent it, and it has finished micro-batch "
                          f"{late[1] - 1}), not {at[late]}: the schedule should take {count + stages - 1} ticks, not "
                          f"{len(ticks)}.")
    return ("m micro-batches through p stages in m + p - 1 ticks: stage s works on micro-batch i at tick s + i, and "
            "each stage idles p - 1 of the ticks, the bubble (p - 1) / (m + p - 1), as pipeline.schedule counts it.")

