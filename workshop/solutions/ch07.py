"""Solutions to the exercises of notebook 07 (prefill and decode)."""

from __future__ import annotations


def decode_gflop(parameters):
    """Exercise 7.1: a multiply and an add per parameter."""
    return 2 * parameters / 1e9


def bound(intensity, ridge):
    """Exercise 7.2: below the ridge point the bandwidth roof is lower: memory-bound."""
    return "memory" if intensity < ridge else "compute"


def decode_ceiling(weight_bytes, bandwidth):
    """Exercise 7.3: every token reads every weight once: bytes/s divided by bytes per token."""
    return bandwidth / weight_bytes
