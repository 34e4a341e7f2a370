"""Notebook 09's checks: the solutions pass on blocks and distributions they never saw; typical mistakes get a hint."""

from __future__ import annotations

import numpy as np
import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch09

solutions = load_solutions("ch09")


def test_the_solutions_pass():
    for verdict in (ch09.check_dequantize_q4_1_block(solutions.dequantize_block),
                    ch09.check_online_update(solutions.online_update),
                    ch09.check_speculative_rule(solutions.acceptance_probability, solutions.residual)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    assert "not attempted" in ch09.check_dequantize_q4_1_block(unattempted).message
    assert "not attempted" in ch09.check_online_update(unattempted).message
    assert "not attempted" in ch09.check_speculative_rule(unattempted, unattempted).message
    not_yet(ch09.check_dequantize_q4_1_block(None), "define")


def _block_parts(block):
    d = float(block[0:2].view(np.float16)[0])
    m = float(block[2:4].view(np.float16)[0])
    return d, m, block[4:] & 0x0F, block[4:] >> 4


def test_q4_1_mistakes():
    def interleaved(block):
        d, m, low, high = _block_parts(block)
        return torch.tensor(np.stack([low, high], 1).reshape(-1), dtype=torch.float32) * d + m

    def swapped(block):
        d, m, low, high = _block_parts(block)
        return torch.tensor(np.concatenate([high, low]), dtype=torch.float32) * d + m

    def no_minimum(block):
        d, m, low, high = _block_parts(block)
        return torch.tensor(np.concatenate([low, high]), dtype=torch.float32) * d

    def integer_scale(block):
        d, m = int(block[0:2].view(np.uint16)[0]), int(block[2:4].view(np.uint16)[0])
        return torch.tensor(np.concatenate([block[4:] & 0x0F, block[4:] >> 4]), dtype=torch.float32) * d + m

    not_yet(ch09.check_dequantize_q4_1_block(interleaved), "weight j + 16")
    not_yet(ch09.check_dequantize_q4_1_block(swapped), "low nibbles")
    not_yet(ch09.check_dequantize_q4_1_block(no_minimum), "minimum m")
    not_yet(ch09.check_dequantize_q4_1_block(integer_scale), "fp16")
    not_yet(ch09.check_dequantize_q4_1_block(lambda block: [0.0] * 16), "32 weights")
    assert ch09.check_dequantize_q4_1_block(lambda b: solutions.dequantize_block(b).tolist()).passed  # a list is fine


def test_online_softmax_mistakes():
    def no_rescale(m, l, o, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l + p.sum(-1, keepdim=True), o + p @ v

    def upside_down(m, l, o, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        rescale = torch.nan_to_num(torch.exp(m_new - m), posinf=0.0)
        return m_new, l * rescale + p.sum(-1, keepdim=True), o * rescale + p @ v

    def forgets_o(m, l, o, scores, v):
        m, l, _ = solutions.online_update(m, l, o, scores, v)
        return m, l, o + torch.exp(scores - m) @ v

    not_yet(ch09.check_online_update(no_rescale), "exp(m_old - m_new)")
    not_yet(ch09.check_online_update(upside_down), "upside down")
    not_yet(ch09.check_online_update(forgets_o), "o: rescale")
    not_yet(ch09.check_online_update(lambda m, l, o, s, v: (m, l)), "three things", "(m, l, o)")


def test_speculative_rule_mistakes():
    def resample_from_p(p, q):
        return p

    def unnormalised(p, q):
        return (p - q).clamp(min=0)

    not_yet(ch09.check_speculative_rule(solutions.acceptance_probability, resample_from_p), "twice")
    not_yet(ch09.check_speculative_rule(solutions.acceptance_probability, unnormalised), "normalise")
    not_yet(ch09.check_speculative_rule(lambda p, q, x: float(p[x] / q[x]), solutions.residual), "exceed 1")
    not_yet(ch09.check_speculative_rule(lambda p, q, x: 1.0, solutions.residual), "min(1, p[x] / q[x])")
    not_yet(ch09.check_speculative_rule(solutions.acceptance_probability, lambda p, q: p[:2]), "shape")
