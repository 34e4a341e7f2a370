"""What the server tests share: the metrics a client reads back, and a bounded wait."""

from __future__ import annotations

import time


def metrics(server) -> dict[str, float]:
    from llm_anatomy.server.metrics import parse_metrics

    return parse_metrics(server.get("/metrics"))


def wait_for(condition, timeout_s: float = 30.0, every_s: float = 0.1):
    """Poll condition() until it is truthy (returns it) or timeout_s passes (returns the last value)."""
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    return value
