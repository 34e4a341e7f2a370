"""The client's helpers that notebook 11 measures with: the engine's clock mapped onto the client's, a bounded poll,
and the queue limit switched over HTTP."""

from __future__ import annotations

import time

from conftest import KEY
from llm_anatomy.server.client import engine_clock_offset, poll_until, set_queue_limit


def test_the_engine_clock_offset_keeps_the_shortest_round_trip():
    start, delays = time.monotonic(), iter([0.03, 0.001, 0.02])

    def read_clock():  # an engine whose clock started at `start`, answering after a delay
        time.sleep(next(delays))
        return time.monotonic() - start
    offset, error = engine_clock_offset(read_clock, tries=3)
    assert error < 0.01 and abs(offset - start) <= error + 0.002


def test_poll_until_returns_the_reading_that_was_done_and_when_or_none_in_time():
    readings = iter(range(100))
    value, took = poll_until(lambda: next(readings), lambda v: v >= 3, timeout_s=5, every_s=0.001)
    assert value == 3 and 0 <= took < 1
    value, took = poll_until(lambda: 0, lambda v: v > 0, timeout_s=0.05, every_s=0.01)
    assert value == 0 and took is None


def test_set_queue_limit_switches_the_servers_limit_and_back(server):
    try:
        assert set_queue_limit(server.root, None, KEY) == {"max_waiting": None}
        assert set_queue_limit(server.root, 3, KEY) == {"max_waiting": 3}
    finally:
        assert set_queue_limit(server.root, 1, KEY) == {"max_waiting": 1}  # the fixture's limit
