"""The engine loop's admission decision (queue or 429), without a server."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.sampling import SamplingParams
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


def test_the_engine_runs_new_prompts_first_unless_told_to_mix_them(scratch_tiny, reference_tokenizer):
    assert EngineLoop(scratch_tiny, reference_tokenizer, kv_blocks=8).scheduler.prefill_first is True
    assert EngineLoop(scratch_tiny, reference_tokenizer, kv_blocks=8, prefill_first=False).scheduler.prefill_first is False
    with pytest.raises(CourseError, match="prefill_first must be True or False"):
        EngineLoop(scratch_tiny, reference_tokenizer, kv_blocks=8, prefill_first="yes")


def test_tokens_are_stamped_on_the_wall_clock_when_they_come_out(scratch_tiny):
    # the scheduler's own clock advances by its model calls only (a few ms here); the server's is the wall clock
    from llm_anatomy.serve.batching import Request
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.serve.scheduler import ContinuousScheduler

    pool = PagedKVPool.for_model(scratch_tiny, 16, 4)
    sched = ContinuousScheduler(scratch_tiny, pool, 2, None, clock=lambda: 100.0)  # the clock is injected
    done = sched.run([Request([1, 2, 3, 4, 5], 3)])[0]
    assert len(done.token_times) == 3 and all(t >= 100.0 for t in done.token_times)
    assert done.ttft_s >= 100.0  # arrival 0 on the engine's clock, first token when the step gave it out
    plain = ContinuousScheduler(scratch_tiny, PagedKVPool.for_model(scratch_tiny, 16, 4), 2, None)
    again = plain.run([Request([1, 2, 3, 4, 5], 3)])[0]  # no clock: the model calls' own time only
    assert again.output == done.output and all(t < 100.0 for t in again.token_times)


def test_the_engine_hands_each_steps_tokens_over_before_its_next_step(scratch_tiny, reference_tokenizer):
    import threading
    import time

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
        engine.submit([5, 6, 7, 8], SamplingParams(0.0, max_tokens=6), put, name="t", received_s=engine.clock())
        assert finished.wait(60)
    finally:
        engine.stop()
    texts = [i for i, e in enumerate(order) if e == "text"]
    assert texts and all(order[i + 1] in (("flush", HAND_OVER_S), "finish") for i in texts), order
    record = engine.records[-1]
    assert record["received_s"] <= record["arrival_s"] <= record["first_token_s"] <= time.monotonic() - engine.t0


def test_penalties_act_on_the_logits_as_the_generation_session_applies_them(scratch_tiny, monkeypatch):
    # each token the scheduler chose is the argmax of Penalties.apply on that step's logits (the session's code),
    # and a strong frequency penalty changes a greedy answer that repeats itself
    import torch

    from llm_anatomy.generate.penalties import Penalties
    from llm_anatomy.serve.batching import Request
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.serve import scheduler
    from llm_anatomy.serve.scheduler import ContinuousScheduler

    penalties = Penalties(presence=1.5, frequency=2.0)
    sample = scheduler.sample

    def watched(request, logits):  # the scheduler's sampler, watched
        token = sample(request, logits)
        expected = int(penalties.apply(logits, request.prompt, request.output).argmax())
        seen.append((token, expected, int(logits.argmax())))
        return token

    monkeypatch.setattr(scheduler, "sample", watched)

    def run(with_penalties):
        sched = ContinuousScheduler(scratch_tiny, PagedKVPool.for_model(scratch_tiny, 32, 4), 2, None,
                                    clock=lambda: 0.0)
        params = SamplingParams(0.0, presence_penalty=penalties.presence if with_penalties else 0.0,
                                frequency_penalty=penalties.frequency if with_penalties else 0.0)
        request = sched.submit(Request([5, 6, 7, 5, 6, 7], 12, params=params))
        for _ in range(20):
            if not sched.step():
                break
        return request.output

    seen = []
    plain = run(False)
    assert len(seen) == 12 and all(token == greedy for token, _, greedy in seen)  # no penalties: the raw argmax
    seen = []
    penalized = run(True)
    assert len(seen) == 12 and all(token == expected for token, expected, _ in seen)
    assert len(set(penalized)) > len(set(plain)) or penalized != plain
    assert torch.is_tensor(penalties.apply(torch.zeros(8), [1], [2]))  # the session's helper, unchanged


def test_a_queue_limit_of_0_takes_a_request_that_a_free_slot_will_take_and_refuses_the_next(scratch_tiny,
                                                                                          reference_tokenizer):
    # what --max-waiting auto gives when the objective leaves no time to wait: nobody queues, but the slots fill
    from llm_anatomy.server.schemas import APIError

    engine = EngineLoop(scratch_tiny, reference_tokenizer, max_batch=2, kv_blocks=32, block_size=4, max_waiting=0)
    for _ in range(2):  # two free slots (the engine is not started: nothing is admitted yet)
        engine.submit([1, 2, 3], SamplingParams(0.0, max_tokens=2), lambda event: None)
    with pytest.raises(APIError) as refused:
        engine.submit([1, 2, 3], SamplingParams(0.0, max_tokens=2), lambda event: None)
    assert refused.value.status == 429 and engine.waiting == 2


def test_a_request_the_scheduler_has_just_admitted_is_not_counted_as_waiting_too(scratch_tiny, reference_tokenizer):
    # The handler decides while the engine thread runs: between the scheduler admitting a request and the engine
    # handing out its first events, the request is running already. Counting it as running and as waiting refused
    # clients that the queue had room for (two slots, a queue of one: the third request must wait, the fourth not).
    from llm_anatomy.server.schemas import APIError

    engine = EngineLoop(scratch_tiny, reference_tokenizer, max_batch=2, kv_blocks=32, block_size=4, max_waiting=1)

    def submit():
        return engine.submit([1, 2, 3], SamplingParams(0.0, max_tokens=2), lambda event: None)

    first, _ = submit(), submit()
    engine.scheduler.submit(first.request)  # what the engine thread does next, up to the admission of the first
    engine.scheduler.now = engine.clock()
    engine.scheduler.schedule()
    assert len(engine.scheduler.running) == 1 and engine.waiting == 2  # admitted, not yet handed out
    submit()  # two in flight, two slots: this one waits, the queue's one place
    with pytest.raises(APIError) as refused:
        submit()
    assert refused.value.status == 429 and "1 requests wait for one" in refused.value.message
