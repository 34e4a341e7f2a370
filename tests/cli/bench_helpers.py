"""What the benchmark tests share: one quick run of a benchmark (in this process), and a check for a real figure."""

from __future__ import annotations

import math

from cli_helpers import quick_bench_json  # noqa: F401  (the tests of each topic import it from here)


def positive(value) -> bool:
    """A real, finite, positive number (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
