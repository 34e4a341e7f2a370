"""The server keeps serving when one engine step fails (issue 45, bug 3): only the requests of the failed step get the
error, their KV blocks are freed, and every other request, waiting or decoding, is served to the end."""

from __future__ import annotations

import threading

import pytest

from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.generate.sampling import SamplingParams


@pytest.fixture(scope="module")
def scratch_tiny():
    from llm_anatomy.model.scratch import ScratchLlama
    from llm_anatomy.weights.random import random_llama

    return ScratchLlama.from_hf(random_llama())


class Client:
    """One request's events, as its HTTP handler would get them."""

    def __init__(self):
        self.events, self.done = [], threading.Event()

    def put(self, event):
        self.events.append(event)
        if event[0] in ("finish", "error"):
            self.done.set()

    @property
    def ending(self):
        return self.events[-1][0] if self.events else None


def test_a_failed_step_fails_its_own_requests_only_and_the_server_keeps_serving(scratch_tiny, reference_tokenizer):
    import torch

    from llm_anatomy.server.engine import EngineLoop

    engine = EngineLoop(scratch_tiny, reference_tokenizer, max_batch=2, kv_blocks=32, block_size=4,
                        prefix_cache=False)
    sched, run = engine.scheduler, engine.scheduler.runner.run
    gate, failed_once = threading.Event(), []

    def flaky(tokens, tables, cached, decodes):  # the first step that runs two decode rows fails (as an OOM would)
        gate.wait(30)
        if decodes == 2 and not failed_once:
            failed_once.append(len(tokens))
            raise RuntimeError("CUDA out of memory (injected)")
        return run(tokens, tables, cached, decodes)

    sched.runner.run = flaky
    clients = [Client() for _ in range(3)]
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    engine.start()
    try:
        for client, prompt in zip(clients, prompts):  # two take the slots, the third waits
            engine.submit(prompt, greedy, client.put, name="t")
        gate.set()
        assert all(c.done.wait(60) for c in clients)
    finally:
        engine.stop()
    assert failed_once == [2]
    assert [c.ending for c in clients] == ["error", "error", "finish"]  # the waiting one was served
    assert "out of memory" in clients[0].events[-1][1]
    finish = clients[2].events[-1]
    text = "".join(e[1] for e in clients[2].events if e[0] == "text")
    want = generate_greedy(scratch_tiny, torch.tensor([prompts[2]]), 5).tokens[0].tolist()
    assert finish[1] == "length" and text == reference_tokenizer.decode(want)
    assert sched.pool.allocator.num_free == 32  # every block is back
    assert [r["finish_reason"] for r in engine.records] == ["error", "error", "length"]


def test_a_step_that_fails_outside_the_model_call_ends_the_running_requests_not_the_waiting_ones(
        scratch_tiny, reference_tokenizer):
    from llm_anatomy.server.engine import EngineLoop

    engine = EngineLoop(scratch_tiny, reference_tokenizer, max_batch=1, kv_blocks=32, block_size=4,
                        prefix_cache=False)
    sched, schedule = engine.scheduler, engine.scheduler.schedule
    gate, broke = threading.Event(), []

    def broken():  # the scheduler's own bookkeeping fails once, after the first request has decoded a token
        gate.wait(30)
        if sched.running and sched.running[0].request.output and not broke:
            broke.append(True)
            raise AssertionError("a bookkeeping bug (injected)")
        return schedule()

    sched.schedule = broken
    first, second = Client(), Client()
    engine.start()
    try:
        engine.submit([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=6), first.put)
        engine.submit([9, 10, 11], SamplingParams(temperature=0.0, max_tokens=3), second.put)
        gate.set()
        assert first.done.wait(60) and second.done.wait(60)
    finally:
        engine.stop()
    assert broke and first.ending == "error" and second.ending == "finish"
    assert sched.pool.allocator.num_free == 32
