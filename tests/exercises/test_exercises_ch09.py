"""Notebook 09's checks: the solutions pass on blocks, matrices, logits and distributions they never saw; typical
mistakes get a message that names them."""

from __future__ import annotations

import math

import numpy as np
import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch09

solutions = load_solutions("ch09")


def test_the_solutions_pass():
    for verdict in (ch09.check_quantize_q4_1_block(solutions.quantize_block),
                    ch09.check_int8_per_channel(solutions.quantize_int8, solutions.kl),
                    ch09.check_greedy_verify(solutions.verify),
                    ch09.check_online_update(solutions.online_update),
                    ch09.check_speculative_rule(solutions.acceptance_probability, solutions.residual)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    assert "not attempted" in ch09.check_quantize_q4_1_block(unattempted).message
    assert "not attempted" in ch09.check_int8_per_channel(unattempted, unattempted).message
    assert "not attempted" in ch09.check_greedy_verify(unattempted).message
    assert "not attempted" in ch09.check_online_update(unattempted).message
    assert "not attempted" in ch09.check_speculative_rule(unattempted, unattempted).message
    not_yet(ch09.check_quantize_q4_1_block(None), "define")


def _q4_1(w, *, steps=15, rounding=np.round, order="file", minimum=True, fp32=False):
    """A Q4_1 quantizer with one typical mistake switched on."""
    m = float(w.min()) if minimum else 0.0
    d = (float(w.max()) - m) / steps
    codes = np.clip(rounding((w - m) / d), 0, 15).astype(np.uint8)
    low, high = {"file": (codes[:16], codes[16:]), "swapped": (codes[16:], codes[:16]),
                 "interleaved": (codes[0::2], codes[1::2])}[order]
    kind = np.float32 if fp32 else np.float16
    return np.concatenate([kind(d).reshape(1).view(np.uint8), kind(m).reshape(1).view(np.uint8), low | (high << 4)])


def test_q4_1_quantizer_mistakes():
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, order="interleaved")), "not codes 2j and 2j + 1")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, order="swapped")), "swapped")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, minimum=False)), "minimum")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, steps=16)), "15 steps")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, rounding=np.floor)), "rounded down")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, fp32=True)), "np.float16")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1(w)[:16]), "20 bytes")
    # gguf's own rule (truncate after adding 0.5) is rounding too, and near-miss types are fine
    assert ch09.check_quantize_q4_1_block(lambda w: _q4_1(w, rounding=lambda x: np.trunc(x + 0.5))).passed
    assert ch09.check_quantize_q4_1_block(lambda w: _q4_1(w).tolist()).passed
    assert ch09.check_quantize_q4_1_block(lambda w: torch.from_numpy(_q4_1(w))).passed


def test_int8_and_kl_mistakes():
    def per_tensor(w):
        scale = w.abs().max() / 127
        return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale.reshape(1)

    def per_column(w):
        scale = w.abs().amax(dim=0) / 127
        return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale

    def over_128(w):
        scale = w.abs().amax(dim=1) / 128
        return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale

    def floored(w):
        codes, scale = solutions.quantize_int8(w)
        return torch.floor(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale

    def reversed_kl(ref, other):
        return solutions.kl(other, ref)

    def summed_kl(ref, other):
        return solutions.kl(ref, other) * ref.shape[0]

    def float_codes(w):
        codes, scale = solutions.quantize_int8(w)
        return codes.float(), scale

    int8, kl = solutions.quantize_int8, solutions.kl
    not_yet(ch09.check_int8_per_channel(per_tensor, kl), "per-tensor")
    not_yet(ch09.check_int8_per_channel(per_column, kl), "one scale per output row")
    not_yet(ch09.check_int8_per_channel(over_128, kl), "127 is the largest code")
    not_yet(ch09.check_int8_per_channel(floored, kl), "rounded down")
    not_yet(ch09.check_int8_per_channel(float_codes, kl), "int8")
    not_yet(ch09.check_int8_per_channel(int8, reversed_kl), "KL(other || ref)")
    not_yet(ch09.check_int8_per_channel(int8, summed_kl), "average over the positions")
    not_yet(ch09.check_int8_per_channel(int8, lambda a, b: float((a.softmax(-1) - b.softmax(-1)).abs().sum())),
            "log-softmax")
    not_yet(ch09.check_int8_per_channel(int8, lambda a, b: solutions.kl(a, b) / math.log(2)), "in bits")


def test_int8_kl_from_torch_distributions_is_refused():
    def library_kl(ref, other):
        from torch.distributions import Categorical, kl_divergence

        return float(kl_divergence(Categorical(logits=ref), Categorical(logits=other)).mean())

    def library_kl_by_module(ref, other):
        return float(torch.distributions.kl.kl_divergence(torch.distributions.Categorical(logits=ref),
                                                          torch.distributions.Categorical(logits=other)).mean())

    not_yet(ch09.check_int8_per_channel(solutions.quantize_int8, library_kl), "kl_divergence")
    not_yet(ch09.check_int8_per_channel(solutions.quantize_int8, library_kl_by_module), "kl_divergence")


def test_greedy_verify_mistakes():
    def off_by_one(logits, drafts):
        best = logits.argmax(-1).tolist()
        kept = next((i for i, d in enumerate(drafts) if d != best[i + 1]), len(drafts))
        return kept, best[kept]

    def counts_every_match(logits, drafts):
        best = logits.argmax(-1).tolist()
        kept = sum(d == b for d, b in zip(drafts, best))
        return kept, best[kept]

    def bonus_from_the_last_row(logits, drafts):
        kept, _ = solutions.verify(logits, drafts)
        return kept, int(logits[-1].argmax())

    def correction_counted_as_kept(logits, drafts):  # the model's own token counted among the drafts kept
        kept, token = solutions.verify(logits, drafts)
        return (kept + 1 if kept < len(drafts) else kept), token

    def the_rejected_draft(logits, drafts):
        kept, token = solutions.verify(logits, drafts)
        return kept, drafts[kept] if kept < len(drafts) else token

    not_yet(ch09.check_greedy_verify(off_by_one), "off by one")
    not_yet(ch09.check_greedy_verify(counts_every_match), "stop at the first rejected draft")
    not_yet(ch09.check_greedy_verify(bonus_from_the_last_row), "logits[kept]")
    not_yet(ch09.check_greedy_verify(the_rejected_draft), "argmax(logits[")
    not_yet(ch09.check_greedy_verify(correction_counted_as_kept), "the correction is not a kept draft")
    not_yet(ch09.check_greedy_verify(lambda logits, drafts: len(drafts)), "(kept, token)")
    assert ch09.check_greedy_verify(lambda lg, d: [torch.tensor(x) for x in solutions.verify(lg, d)]).passed  # tensors


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


def test_online_update_takes_flashattention_1s_normalised_output():
    def normalised(m, l, o, scores, v):  # FlashAttention-1 keeps o divided by l after every block
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new)
        l_new = l * rescale + p.sum(-1, keepdim=True)
        return m_new, l_new, (o * l * rescale + p @ v) / l_new

    def normalised_without_rescale(m, l, o, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        l_new = l * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
        return m_new, l_new, (o * l + p @ v) / l_new

    verdict = ch09.check_online_update(normalised)
    assert verdict.passed and "normalised" in verdict.message, verdict.message
    assert "normalised" not in ch09.check_online_update(solutions.online_update).message
    not_yet(ch09.check_online_update(normalised_without_rescale), "o: rescale")


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
