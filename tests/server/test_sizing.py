"""The queue limit sized from a TTFT objective (server/sizing.py, `--max-waiting auto`): numbers, no server."""

from __future__ import annotations

import math

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.server.sizing import OBJECTIVE_FACTOR, QueueSizer, queue_limit


def test_the_limit_is_the_longest_queue_whose_drain_fits_the_objective():
    # 1.0 s objective, 0.2 s prefill, one admission every 0.2 s: 4 may wait (the 4th gets a slot at 0.8 s, its first
    # token at 1.0 s); a 5th would reach 1.2 s
    assert queue_limit(1.0, 0.2, 0.2) == 4
    assert queue_limit(1.0, 0.2, 0.25) == 3  # a slower service rate: a shorter queue (0.75 s of waiting, 3 x 0.25)
    assert queue_limit(1.0, 0.2, 0.3) == 2  # 0.8 / 0.3 = 2.67: the 3rd would wait 0.9 s, past the 0.8 s left
    assert queue_limit(2.0, 0.2, 0.2) == 9  # a looser objective: a longer queue
    # W = (q + 1) / mu: limit x seconds per admission (the wait) + prefill stays within the objective, one more does not
    for objective, prefill, per in [(0.9, 0.1, 0.07), (3.0, 0.45, 0.33), (0.5, 0.05, 0.01)]:
        n = queue_limit(objective, prefill, per)
        assert n * per + prefill <= objective + 1e-9 < (n + 1) * per + prefill


def test_an_objective_the_prefill_alone_uses_up_queues_nobody():
    assert queue_limit(0.3, 0.3, 0.1) == 0
    assert queue_limit(0.2, 0.5, 0.1) == 0  # not a negative limit
    assert queue_limit(1.0, 0.2, 0.9) == 0  # one admission takes longer than the wait left


@pytest.mark.parametrize("args", [(math.nan, 0.1, 0.1), (-1.0, 0.1, 0.1), (1.0, math.inf, 0.1), (1.0, 0.1, 0.0),
                                  (1.0, 0.1, -0.2), (True, 0.1, 0.1), ("1", 0.1, 0.1)])
def test_bad_figures_are_refused_with_a_sentence(args):
    with pytest.raises(CourseError, match="must be a finite number of seconds"):
        queue_limit(*args)


def test_the_sizer_takes_3x_the_shortest_recent_prefill_by_default():
    sizer = QueueSizer()
    assert sizer.objective_s() is None and sizer.limit(0.1) == 0  # nothing timed yet: nobody waits
    for seconds in (0.30, 0.10, 0.25):
        sizer.prefilled(seconds)
    assert sizer.objective_s() == pytest.approx(OBJECTIVE_FACTOR * 0.10)
    assert sizer.limit(0.05) == 4  # (0.3 - 0.1) / 0.05
    assert sizer.limit(0.5) == 0
    given = QueueSizer(ttft_objective_s=1.0)
    assert given.limit(0.25) == 4  # no prefill timed yet: the whole objective is waiting
    given.prefilled(0.2)
    assert given.limit(0.25) == 3


def test_the_engine_uses_the_sized_limit_with_auto(tiny_model):
    from llm_anatomy.model.scratch import ScratchLlama
    from llm_anatomy.server.engine import EngineLoop

    engine = EngineLoop(ScratchLlama.from_hf(tiny_model), None, max_waiting="auto", ttft_objective_s=1.0)
    engine.sizer.prefilled(0.2)
    engine.admissions.extend([0.0, 0.25, 0.5, 0.75, 1.0])  # one admission every 0.25 s
    assert engine.queue_limit() == 3
    engine.max_waiting = 5
    assert engine.queue_limit() == 5
    for bad in ("Auto", -1, 2.5, True):
        with pytest.raises(CourseError, match="max_waiting"):
            EngineLoop(tiny_model, None, max_waiting=bad)
    with pytest.raises(CourseError, match="TTFT objective"):
        EngineLoop(engine.model, None, max_waiting="auto", ttft_objective_s=0)
