"""The engine loop's admission decision (queue or 429), without a server."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.server.engine import EngineLoop, admission


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
