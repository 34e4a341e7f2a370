"""The engine loop's admission decision (queue or 429), without a server."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.server.engine import EngineLoop, admission


@pytest.fixture(scope="module")
def scratch_tiny():
    from llm_anatomy.model.scratch import ScratchLlama
    from llm_anatomy.weights.random import random_llama

    return ScratchLlama.from_hf(random_llama())


def test_admission_queues_below_the_limit_and_refuses_at_it_with_a_whole_second_retry():
    assert admission(0, None, 5.0) == (True, 0) and admission(10_000, None, 5.0) == (True, 0)  # no limit
    assert admission(3, 4, 0.2) == (True, 0)
    assert admission(4, 4, 0.2) == (False, 1)  # one admission (0.2 s) frees a place: at least 1 s
    assert admission(6, 4, 0.7) == (False, 3)  # three admissions of 0.7 s: 2.1 s, rounded up
    assert admission(0, 0, 0.1) == (False, 1)  # a limit of 0: nobody waits


def test_a_bad_queue_limit_is_refused(tiny_model):
    for bad in (-1, 1.5, True):
        with pytest.raises(CourseError, match="max_waiting"):
            EngineLoop(tiny_model, None, max_waiting=bad)


def test_tokens_are_stamped_on_the_wall_clock_when_they_come_out(scratch_tiny):
    # the scheduler's own clock advances by its model calls only (a few ms here); the server's is the wall clock
    from llm_anatomy.serve.batching import Request
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.server.scheduler import WallClockScheduler

    sched = WallClockScheduler(scratch_tiny, PagedKVPool.for_model(scratch_tiny, 16, 4), 2, None, clock=lambda: 100.0)
    done = sched.run([Request([1, 2, 3, 4, 5], 3)])[0]
    assert len(done.token_times) == 3 and all(t >= 100.0 for t in done.token_times)
    assert done.ttft_s >= 100.0  # arrival 0 on the engine's clock, first token when the step gave it out


def test_the_engine_hands_each_steps_tokens_over_before_its_next_step(scratch_tiny, reference_tokenizer):
    import threading
    import time

    from llm_anatomy.generate.sampling import SamplingSettings
    from llm_anatomy.server.engine import HAND_OVER_S

    order, finished = [], threading.Event()

    def put(event):
        order.append(event[0])
        if event[0] == "finish":
            finished.set()

    engine = EngineLoop(scratch_tiny, reference_tokenizer, max_batch=2, kv_blocks=32, block_size=4)
    engine.flush = lambda timeout_s: order.append(("flush", timeout_s))
    engine.start()
    try:
        engine.submit([5, 6, 7, 8], 6, SamplingSettings(0.0), 0, [], None, put, name="t", received_s=engine.clock())
        assert finished.wait(60)
    finally:
        engine.stop()
    texts = [i for i, e in enumerate(order) if e == "text"]
    assert texts and all(order[i + 1] in (("flush", HAND_OVER_S), "finish") for i in texts), order
    record = engine.records[-1]
    assert record["received_s"] <= record["arrival_s"] <= record["first_token_s"] <= time.monotonic() - engine.t0
