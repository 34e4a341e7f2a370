"""Checks for notebook 07 (prefill and decode)."""

from __future__ import annotations

from . import exercise, expect


@exercise
def check_decode_gflop(answer, parameters: float = 134.5e6) -> str:
    """GFLOP to decode one token with a model of `parameters` (about 2 per parameter: a multiply and an add)."""
    expect(answer is not None, "assign a number of GFLOP to `answer`.")
    expect(isinstance(answer, (int, float)) and not isinstance(answer, bool), "give a number of GFLOP, e.g. 1.5.")
    right = 2 * parameters / 1e9
    expect(abs(answer - right / 2) > 0.05 * right, "each weight does a multiply AND an add: 2 FLOP per parameter.")
    expect(answer < 1e6, "give GFLOP (1e9 FLOP), not FLOP.")
    expect(abs(answer - right) <= 0.1 * right, f"{answer} is off: 2 x parameters / 1e9.")
    return f"about {right:.2f} GFLOP per token: tiny next to the bytes each token reads."


@exercise
def check_bound(answer, intensity: float, ridge: float) -> str:
    """'memory' or 'compute': what limits a run of `intensity` FLOP/byte on a machine whose ridge is `ridge`."""
    expect(answer in ("memory", "compute"), "answer 'memory' or 'compute'.")
    right = "memory" if intensity < ridge else "compute"
    expect(answer == right, f"compare the run's intensity ({intensity:.2f} FLOP/byte) with the ridge point "
                            f"({ridge:.1f} FLOP/byte): left of the ridge, the bandwidth roof is the lower one.")
    return f"{right}-bound: {intensity:.2f} FLOP/byte is {'below' if right == 'memory' else 'above'} the ridge."


@exercise
def check_decode_ceiling(answer, weight_bytes: float, bandwidth: float) -> str:
    """The most tokens/s batch-1 decode can reach: bandwidth / bytes read per token (the weights)."""
    expect(answer is not None, "assign a number of tokens per second to `answer`.")
    expect(isinstance(answer, (int, float)) and not isinstance(answer, bool), "give a number of tokens/s.")
    right = bandwidth / weight_bytes
    expect(answer <= 0 or abs(answer * right - 1) > 0.1, "upside down: tokens/s = bytes/s / bytes per token.")
    expect(abs(answer - right) <= 0.1 * right, f"{answer:.3g} is off: divide the measured bandwidth (bytes/s) by "
                                               "the bytes of the weights that every token reads.")
    return f"at most {right:.0f} tokens/s at batch 1, however fast the arithmetic units are."
