"""Checks for notebook 09 (making decode fast): a Q4_1 block, the online softmax, the speculative rule."""

from __future__ import annotations

import sys

import numpy as np
import torch

from ..fast import gguf_blocks, tiled_attention
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)


def _q4_1_blocks(n: int, seed: int) -> list[np.ndarray]:
    """n random Q4_1 blocks of 20 bytes: fp16 d > 0, fp16 m, 16 bytes of codes."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(n):
        d = np.array([rng.uniform(0.001, 0.05)], dtype=np.float16)
        m = np.array([rng.uniform(-0.4, 0.1)], dtype=np.float16)
        codes = rng.integers(0, 256, size=16, dtype=np.uint8)
        blocks.append(np.concatenate([d.view(np.uint8), m.view(np.uint8), codes]))
    return blocks


def _no_library_dequantize() -> forbidden_all:
    quants = sys.modules.get("gguf.quants")
    return forbidden_all([(gguf_blocks, name) for name in ("dequantize_q4_1", "dequantize_gguf", "q4_1_blocks")]
                         + [(quants, "dequantize")],
                         "read d, m and the codes yourself: the block layout is the exercise")


@exercise
@hints("Read the table above the exercise: the first 4 bytes are two fp16 numbers, the other 16 hold two codes each.",
       "NumPy reads bytes as another type with .view: block[0:2].view(np.float16) is d. A byte's low 4 bits are "
       "byte & 0x0F, its high 4 bits byte >> 4; the low halves are weights 0..15, the high halves 16..31.",
       "d, m = fp16 at bytes 0-1 and 2-3; codes = np.concatenate([block[4:] & 0x0F, block[4:] >> 4]); "
       "return torch.tensor(codes, dtype=torch.float32) * d + m")
def check_dequantize_q4_1_block(dequantize_block) -> str:
    """Exercise 9.1: dequantize_block(block) -> the 32 fp32 weights of one 20-byte Q4_1 block."""
    expect(callable(dequantize_block), "define a function dequantize_block(block) returning 32 weights.")
    for block in _q4_1_blocks(6, seed=9):  # blocks you have not seen
        with _no_library_dequantize():
            got = returned(call(dequantize_block, block.copy()), "tensor", "the block's 32 weights")
        expect(got.numel() == 32, f"return the block's 32 weights, not {got.numel()} numbers (20 bytes: 2 for d, 2 for "
                                  "m, 16 of codes holding two weights each).")
        got = got.reshape(-1).float()
        want = gguf_blocks.dequantize_q4_1(block, (1, 32))[0]
        d, m = float(block[:2].view(np.float16)[0]), float(block[2:4].view(np.float16)[0])
        low, high = block[4:] & 0x0F, block[4:] >> 4
        interleaved = torch.tensor(np.stack([low, high], axis=1).reshape(-1), dtype=torch.float32) * d + m
        swapped = torch.tensor(np.concatenate([high, low]), dtype=torch.float32) * d + m
        no_min = torch.tensor(np.concatenate([low, high]), dtype=torch.float32) * d
        expect(got.abs().max() < 1e3, "the weights are huge: read d and m as fp16 numbers (np.float16 or "
                                      "torch.float16 views of 2 bytes each), not as integers.")
        expect(not torch.allclose(got, no_min), "every weight is off by the same amount: add the minimum m.")
        expect(not torch.allclose(got, interleaved), "the codes are in the wrong order: byte j holds weight j in "
                                                     "its low nibble and weight j + 16 in its high nibble, "
                                                     "not weights 2j and 2j + 1.")
        expect(not torch.allclose(got, swapped), "low and high nibbles are swapped: weights 0-15 come from the "
                                                 "low nibbles (byte & 0x0F), weights 16-31 from the high ones (byte >> 4).")
        expect(torch.allclose(got, want, rtol=0, atol=1e-6),
               f"expected {[round(x, 4) for x in want[:4].tolist()]}... got {[round(x, 4) for x in got[:4].tolist()]}... "
               "Hint: weight = d * code + m, in fp32.")
    return "weight = d * code + m: 20 bytes for 32 weights, 5 bits each, as llama.cpp reads them."


@exercise
@hints("Three things change when a block arrives: the running maximum, the sum of exponentials, the weighted values.",
       "m_new = max(m, the block's max per row). Everything summed so far was measured against m: multiply l and o "
       "by exp(m - m_new), then add the block's exp(scores - m_new) (to l, summed; to o, times v).",
       "m_new = torch.maximum(m, scores.amax(-1, keepdim=True)); r = torch.exp(m - m_new); p = torch.exp(scores - "
       "m_new); return m_new, l * r + p.sum(-1, keepdim=True), o * r + p @ v")
def check_online_update(online_update) -> str:
    """Exercise 9.2: online_update(m, l, o, scores, v) -> the running (max, sum, weighted values) after one block."""
    online_softmax_update = tiled_attention.online_softmax_update
    library = [(tiled_attention, name) for name in ("online_softmax_update", "online_softmax", "tiled_attention")]
    expect(callable(online_update), "define a function online_update(m, l, o, scores, v) returning (m, l, o).")
    g = torch.Generator().manual_seed(11)
    scores, v = torch.randn(3, 24, generator=g) * 4, torch.randn(24, 5, generator=g)  # 3 queries, 24 keys
    scores[:, 16:] += 6  # the last block holds the largest scores: the old sums must shrink
    ours = (torch.full((3, 1), float("-inf")), torch.zeros(3, 1), torch.zeros(3, 5))
    state = ours
    for start in range(0, 24, 8):
        block = (scores[:, start:start + 8], v[start:start + 8])
        ref = online_softmax_update(*ours, *block)
        with forbidden_all(library, "rescale and add yourself: the update is the exercise"):
            out = returned(call(online_update, *(t.clone() for t in state), *(t.clone() for t in block)), "triple",
                           "(m, l, o)")
        m, l, o = (returned(t, "tensor", "m, l and o").float() for t in out)
        expect(m.shape == (3, 1) and l.shape == (3, 1) and o.shape == (3, 5),
               f"keep the shapes: m and l [queries, 1], o [queries, d]; got {tuple(m.shape)}, {tuple(l.shape)}, "
               f"{tuple(o.shape)}.")
        expect(torch.allclose(m, ref[0]), "m is the running maximum: torch.maximum(m, scores.amax(-1, keepdim=True)).")
        if start and bool((ref[0] > state[0]).any()):  # this block raised the maximum of some rows
            block_sum = torch.exp(scores[:, start:start + 8] - ref[0]).sum(-1, keepdim=True)
            expect(not torch.allclose(l, state[1] + block_sum, rtol=1e-4),
                   "the old sum l was counted against the old maximum: multiply it by exp(m_old - m_new) first.")
            expect(not torch.allclose(l, state[1] * torch.exp(ref[0] - state[0]) + block_sum, rtol=1e-4),
                   "the rescale factor is upside down: exp(m_old - m_new), which is at most 1, not exp(m_new - m_old).")
        expect(torch.allclose(l, ref[1], rtol=1e-4), "l: rescale the old sum by exp(m_old - m_new), then add "
                                                     "exp(scores - m_new) summed over the block.")
        expect(torch.allclose(o, ref[2], rtol=1e-4, atol=1e-5), "o: rescale the old o the same way as l, then add "
                                                                "exp(scores - m_new) @ v.")
        ours, state = ref, (m, l, o)
    expect(torch.allclose(state[2] / state[1], torch.softmax(scores, -1) @ v, atol=1e-5), "o / l should equal softmax @ v.")
    return "three blocks folded one at a time give softmax(scores) @ v exactly, without ever holding all the scores."


def _pairs():
    g = torch.Generator().manual_seed(5)
    for size, spread in ((6, 1.0), (30, 2.5), (12, 0.3)):
        p = torch.softmax(torch.randn(size, generator=g) * spread, dim=-1).double()
        q = torch.softmax(torch.randn(size, generator=g) * spread, dim=-1).double()
        yield p, q
    p = torch.tensor([0.7, 0.2, 0.1, 0.0], dtype=torch.float64)
    yield p, torch.tensor([0.0, 0.1, 0.2, 0.7], dtype=torch.float64)  # a bad draft, with zeros on both sides


@exercise
@hints("A drafted token x is kept more often when the model likes it at least as much as the draft does.",
       "Keep x with probability min(1, p(x) / q(x)). On rejection, draw from what the kept tokens left missing: "
       "max(p - q, 0), normalised to sum to 1.",
       "acceptance_probability: return min(1.0, float(p[x] / q[x])); residual: r = (p - q).clamp(min=0); "
       "return r / r.sum()")
def check_speculative_rule(acceptance_probability, residual) -> str:
    """Exercise 9.3: acceptance_probability(p, q, x) and residual(p, q): together, the output is distributed as p."""
    expect(callable(acceptance_probability) and callable(residual),
           "define acceptance_probability(p, q, x) and residual(p, q).")
    for p, q in _pairs():
        accept = torch.tensor([returned(call(acceptance_probability, p.clone(), q.clone(), x), "number",
                                        "the probability of keeping the draft")
                               if q[x] > 0 else 0.0 for x in range(p.numel())], dtype=torch.float64)
        expect(bool((accept <= 1 + 1e-9).all()), "a probability cannot exceed 1: min(1, p[x] / q[x]).")
        expect(bool((accept >= 0).all()), "a probability cannot be negative.")
        drafted = q > 0
        right_accept = torch.where(drafted, (p / q.where(drafted, 1.0)).clamp(max=1.0), 0.0)
        if not torch.allclose(accept, right_accept, atol=1e-9):
            upside = torch.where(drafted, (q / p.where(p > 0, 1.0)).clamp(max=1.0), 0.0)
            expect(not torch.allclose(accept, upside, atol=1e-9), "the acceptance is upside down: keep x with "
                                                                  "probability min(1, p[x] / q[x]), the model's "
                                                                  "probability over the draft's.")
            expect(False, f"acceptance_probability should be min(1, p[x] / q[x]): "
                          f"{[round(x, 3) for x in right_accept.tolist()[:5]]}..., yours "
                          f"{[round(x, 3) for x in accept.tolist()[:5]]}...")
        r = returned(call(residual, p.clone(), q.clone()), "tensor", "the residual distribution").double()
        expect(r.shape == p.shape, f"residual(p, q) returns a distribution over the vocabulary, shape {tuple(p.shape)}.")
        kept = q * accept  # P(draft x and keep it)
        rejected = 1 - kept.sum()
        if rejected > 1e-9:
            expect(bool((r >= -1e-12).all()), "the residual has negative entries: clamp p - q at 0 before "
                                              "normalising, max(p - q, 0).")
            expect(abs(float(r.sum()) - 1) < 1e-6, f"the residual sums to {float(r.sum()):.3f}: normalise it.")
            expect(not torch.allclose(r, p), "resampling from p itself counts the tokens the draft already gave "
                                             "twice: sample from max(p - q, 0), normalised.")
            swapped = (q - p).clamp(min=0)
            expect(not torch.allclose(r, swapped / swapped.sum()), "that is max(q - p, 0): the residual is what p has "
                                                                   "MORE of than the draft, max(p - q, 0), normalised.")
        output = kept + rejected * r  # the distribution of the token that comes out
        expect(torch.allclose(output, p, atol=1e-6),
               f"your acceptance is right, but with your residual the tokens would come out as "
               f"{[round(x, 3) for x in output.tolist()[:5]]}..., not as p = {[round(x, 3) for x in p.tolist()[:5]]}"
               "...: on rejection, draw from max(p - q, 0), normalised.")
    return "kept drafts give min(p, q); the residual adds exactly what is missing, max(p - q, 0): together p."
