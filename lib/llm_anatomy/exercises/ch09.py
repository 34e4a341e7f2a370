"""Checks for notebook 09 (making decode fast): quantizing a Q4_1 block, int8 per channel and its KL, the greedy
verify step, the online softmax (the speculative rule, exercise 9.5, is in ch09_speculative.py)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from ..fast import gguf_blocks, tiled_attention
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from .ch09_speculative import check_speculative_rule  # noqa: F401  (exercise 9.5, the speculative rule, in its own file)


def _weight_blocks(n: int, seed: int) -> list[np.ndarray]:
    """n blocks of 32 fp32 weights the notebook never shows: narrow and wide, centred and shifted, one all negative."""
    rng = np.random.default_rng(seed)
    blocks = [(rng.standard_normal(32) * rng.uniform(0.005, 0.2) + rng.uniform(-0.1, 0.1)).astype(np.float32)
              for _ in range(n - 1)]
    return blocks + [-rng.uniform(0.01, 0.3, 32).astype(np.float32)]


def _no_library_quantizer() -> forbidden_all:
    quants = sys.modules.get("gguf.quants")
    from ..fast import quantize

    return forbidden_all([(quants, "quantize"), (quants, "Q4_1")]
                         + [(quantize, name) for name in ("int4_codes", "quantize_int4_groupwise", "fake_quantize")],
                         "find d, m and the codes yourself: the quantizer is the exercise")


@exercise
@hints("A block keeps 16 evenly spaced levels between its smallest and its largest weight; each weight takes the "
       "nearest level, and the table above says where each part of the 20 bytes goes.",
       "m = the block's minimum, d = (max - min) / 15, code = round((w - m) / d) in 0..15. Byte j holds code j in its "
       "low 4 bits and code j + 16 in its high 4 bits; d and m go first, as fp16 (2 bytes each).",
       "codes = np.clip(np.round((w - m) / d), 0, 15).astype(np.uint8); packed = codes[:16] | (codes[16:] << 4); "
       "return np.concatenate([np.float16(d).reshape(1).view(np.uint8), np.float16(m).reshape(1).view(np.uint8), "
       "packed])")
def check_quantize_q4_1_block(quantize_block) -> str:
    """Exercise 9.1: quantize_block(weights) -> the 20 bytes of one Q4_1 block, read back by gguf_blocks and gguf."""
    import gguf.quants

    expect(callable(quantize_block), "define a function quantize_block(weights) returning the block's 20 bytes.")
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    for w in _weight_blocks(6, seed=2409):  # blocks you have not seen
        with _no_library_quantizer():
            got = returned(call(quantize_block, w.copy()), "tensor", "the block's 20 bytes")
        raw = np.asarray(got.detach().cpu().numpy() if hasattr(got, "detach") else got).reshape(-1)
        expect(raw.size == 20, f"a Q4_1 block is 20 bytes (d and m as fp16, 2 bytes each, then 16 bytes of codes), not "
                               f"{raw.size}" + (": store d and m as np.float16, not float32." if raw.size == 24 else "."))
        expect(raw.dtype == np.uint8 or (np.all(raw == np.round(raw)) and raw.min() >= 0 and raw.max() <= 255),
               "return bytes: a NumPy uint8 array of 20 values from 0 to 255.")
        raw = raw.astype(np.uint8)
        back = gguf_blocks.dequantize_q4_1(raw, (1, 32))[0].numpy()  # the library's reader of the file's blocks
        theirs = gguf.quants.dequantize(raw, q4_1).reshape(-1)  # and the gguf package's
        expect(np.array_equal(back, theirs), "gguf and the course read your bytes differently: check the layout.")
        lo, hi = float(w.min()), float(w.max())
        d32 = (hi - lo) / 15
        d16, m16 = float(raw[:2].view(np.float16)[0]), float(raw[2:4].view(np.float16)[0])
        tolerance = d32 / 2 + 15 * abs(d32 - float(np.float16(d32))) + abs(lo - float(np.float16(lo))) + 1e-7
        error = float(np.abs(back - w).max())
        if error > tolerance:
            def near(a: float, b: float) -> bool:
                return abs(a - b) <= 1e-3 * abs(b) + 1e-7

            big = [float(raw[i:i + 2][::-1].copy().view(np.float16)[0]) for i in (0, 2)]  # each fp16 read big-endian
            expect(not (near(big[0], d32) and near(big[1], lo)), "d and m are written big-endian (high byte first): "
                   "GGUF stores little-endian numbers. np.float16(d).reshape(1).view(np.uint8) on an x86 or ARM "
                   "machine, or np.array([d], dtype='<f2').view(np.uint8), gives the right two bytes.")
            expect(not (near(d16, lo) and near(m16, d32)) or near(d32, lo), "m comes before d in your block: a Q4_1 "
                   "block starts with d (the step), then m (the minimum), each an fp16, then the 16 bytes of codes.")
            codes = np.concatenate([raw[4:] & 0x0F, raw[4:] >> 4])
            interleaved = np.empty(32, dtype=np.uint8)
            interleaved[0::2], interleaved[1::2] = codes[:16], codes[16:]  # what was meant, if packed as 2j, 2j + 1
            for meant, words in ((interleaved, "byte j holds code j in its low nibble and code j + 16 in its high "
                                               "one, not codes 2j and 2j + 1"),
                                 (np.concatenate([codes[16:], codes[:16]]), "low and high nibbles are swapped: codes "
                                                                            "0-15 go in the low nibbles, 16-31 in the high ones")):
                expect(np.abs(d16 * meant.astype(np.float32) + m16 - w).max() > tolerance, words + ".")
            expect(abs(m16) > 0.5 * abs(lo) or abs(lo) < 1e-3, "every weight is off by the block's minimum: store m = "
                                                                "min(w) and count the codes up from it, (w - m) / d.")
            expect(abs(d16 - (hi - lo) / 16) > 0.1 * abs(d32 - (hi - lo) / 16),
                   "16 levels make 15 steps: d = (max - min) / 15, so that code 15 lands on the largest weight.")
            floor = np.floor((w - lo) / d32).clip(0, 15)
            expect(np.mean(codes == floor) < 0.9, "the codes are rounded down: round to the nearest code (floor "
                                                     "moves a weight by up to a whole step, round by half of one).")
            expect(False, f"your bytes read back {error:.2e} from the weights at worst; half a step is {d32 / 2:.2e}: "
                          "m = min, d = (max - min) / 15, code = round((w - m) / d).")
    return "32 weights in 20 bytes, read back by the course's reader and by gguf within half a step: a Q4_1 block."


def _matrices(seed: int):
    """Weight matrices [out, in] the notebook never shows, some rows far larger than others (as real layers have)."""
    g = torch.Generator().manual_seed(seed)
    for out_f, in_f in ((48, 32), (20, 64)):
        w = torch.randn(out_f, in_f, generator=g) * 0.05
        w[::7] *= 20  # a few rows with outliers
        yield w, torch.randn(16, in_f, generator=g) * 3  # and inputs for a layer that makes logits from them


@exercise
@hints("Each output row gets its own scale, chosen so that the row's largest weight lands on the largest code.",
       "scale = max|w| over the row / 127; code = round(w / scale) in -127..127, stored as int8. For the KL, take "
       "log-softmax of both logits and sum p_ref * (log p_ref - log p_other) over the vocabulary.",
       "scale = w.abs().amax(dim=1) / 127; codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8); "
       "kl: a, b = logits.log_softmax(-1), other.log_softmax(-1); return (a.exp() * (a - b)).sum(-1).mean()")
def check_int8_per_channel(quantize_int8, kl) -> str:
    """Exercise 9.2: quantize_int8(w) -> (codes [out, in] int8, scale [out]); kl(ref_logits, other_logits) in nats."""
    from ..fast import quantize
    from ..measure import quality

    expect(callable(quantize_int8) and callable(kl), "define quantize_int8(w) and kl(ref_logits, other_logits).")
    library = [(quantize, "quantize_int8_per_channel"), (quantize, "fake_quantize"), (quality, "logit_kl"),
               (torch, "quantize_per_channel"), (torch.nn.functional, "kl_div"),
               (torch.distributions.kl, "kl_divergence")]  # Categorical's KL, under any name it is reached by
    for w, x in _matrices(seed=2410):
        with forbidden_all(library, "scale, round and measure yourself: the quantizer and the KL are the exercise"):
            codes, scale = (returned(t, "tensor", "codes and scale") for t in
                            returned(call(quantize_int8, w.clone()), "pair", "(codes, scale)"))
        expect(codes.shape == w.shape, f"codes have the weights' shape {tuple(w.shape)}, not {tuple(codes.shape)}.")
        expect(codes.dtype == torch.int8, f"store the codes as int8 (1 byte each), not {codes.dtype}.")
        expect(scale.numel() != 1, "one scale for the whole matrix is per-tensor: give each output row its own.")
        expect(scale.numel() == w.shape[0], f"one scale per output row: {w.shape[0]} of them, not {scale.numel()} "
                                            "(a scale per input column is per-channel on the wrong axis).")
        scale = scale.reshape(-1).float()
        want_codes, want_scale = quantize.quantize_int8_per_channel(w)
        expect(not torch.allclose(scale, w.abs().amax(1) / 128), "127 is the largest code: scale = max|w| / 127 "
                                                                 "(with 128 the largest weight cannot be stored).")
        expect(torch.allclose(scale, want_scale, rtol=1e-5), "scale = max|w| over each row / 127.")
        back = codes.float() * scale[:, None]
        expect(not torch.equal(codes, torch.floor(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
               or torch.equal(codes, want_codes), "the codes are rounded down: round to the nearest code.")
        expect(torch.equal(codes, want_codes), f"codes should be round(w / scale); your round trip is "
                                               f"{(back - w).abs().max():.2e} off at worst.")
        ref_logits, logits = x @ w.T, x @ back.T  # [16, out]: a layer's outputs read as logits
        want_kl = quality.logit_kl(ref_logits.double(), logits.double())  # float64: the learner's may be either
        with forbidden_all(library, "scale, round and measure yourself: the quantizer and the KL are the exercise"):
            got_kl = returned(call(kl, ref_logits.clone(), logits.clone()), "number", "the KL in nats")
        reverse = quality.logit_kl(logits.double(), ref_logits.double())

        def near(value: float, to: float) -> bool:  # 1e-3 relative, and float32's rounding of log-probabilities
            return abs(value - to) <= 1e-3 * to + 3e-7  # (a float32 logsumexp by hand is ~1e-7 nats off)

        if not near(got_kl, want_kl):
            expect(not near(got_kl, reverse) or near(want_kl, reverse),
                   "that is KL(other || ref): weigh by the reference's probabilities, p_ref * (log p_ref - log p_other).")
            expect(not near(got_kl, want_kl * ref_logits.shape[0]), "average over the positions (the rows), not "
                                                                     "their sum.")
            expect(not near(got_kl, want_kl / np.log(2)), "that is the KL in bits (log base 2): the exercise wants "
                                                         "nats, the natural log (torch.log, log_softmax), as the "
                                                         "notebook's tables print it; bits = nats / ln 2.")
            expect(False, f"KL(ref || other) here is {want_kl:.3e} nats, yours {got_kl:.3e}: use log-softmax of both "
                          "logits and sum over the vocabulary.")
        shared = w.abs().max() / 127  # per-tensor: the outlier rows set everyone's step
        per_tensor_kl = quality.logit_kl(ref_logits, x @ (torch.round(w / shared).clamp(-127, 127) * shared).T)
    return (f"int8 per channel: one byte a weight, KL {want_kl:.1e} nats on the last held-back layer (one scale for the "
            f"whole matrix: {per_tensor_kl:.1e}).")


def _verify_cases():
    """(logits [k + 1, vocab], drafts [k]) the notebook never shows: a rejection early, late, none; matches after one."""
    g = torch.Generator().manual_seed(2411)
    for k, kept, after in ((3, 0, True), (4, 2, True), (5, 5, False), (1, 1, False), (6, 3, True)):
        logits = torch.randn(k + 1, 40, generator=g)  # [k + 1, vocab]
        best = logits.argmax(-1).tolist()
        drafts = best[:kept] + [(best[kept] + 1) % 40] * (kept < k)  # the first `kept` agree, then one does not
        drafts += best[len(drafts):k] if after else [(b + 3) % 40 for b in best[len(drafts):k]]  # later ones agree
        yield logits, drafts[:k], kept


@exercise
@hints("Position i of the pass is what the model would say after the last token and the first i drafts.",
       "Walk the drafts in order: draft i is kept if it equals the argmax of logits[i]; stop at the first that is "
       "not. The pass's own token is the argmax at the position where you stopped.",
       "kept = 0; while kept < len(drafts) and drafts[kept] == int(logits[kept].argmax()): kept += 1; "
       "return kept, int(logits[kept].argmax())")
def check_greedy_verify(verify) -> str:
    """Exercise 9.3: verify(logits [k + 1, vocab], drafts [k]) -> (drafts kept, the token the pass adds)."""
    from ..fast import speculative

    expect(callable(verify), "define a function verify(logits, drafts) returning (kept, token).")
    for logits, drafts, kept in _verify_cases():
        with forbidden_all([(speculative, "_verify"), (speculative, "speculative_generate")],
                           "compare the drafts with the model's choices yourself: the verify step is the exercise"):
            got = returned(call(verify, logits.clone(), list(drafts)), "pair", "(kept, token)")
        n, token = returned(got[0], "whole", "the number of drafts kept"), returned(got[1], "id", "the token")
        best = logits.argmax(-1).tolist()
        shifted = next((i for i in range(len(drafts)) if drafts[i] != best[i + 1]), len(drafts))
        if n != kept:  # the correction returned as the token, and counted among the kept drafts as well:
            expect(not (n == kept + 1 and kept < len(drafts) and token == best[kept] != best[n]),
                   f"you kept {n}, one more than the {kept} drafts that agree before the first rejection: the "
                   "correction is not a kept draft. kept counts only drafts equal to the model's choice; the "
                   "model's own token after them, argmax(logits[kept]), is the second thing you return.")
            expect(not (n == shifted and shifted != kept), "off by one: logits[i] already predicts the token after "
                                                           "draft i - 1, so compare draft i with logits[i].argmax().")
            expect(n != sum(d == b for d, b in zip(drafts, best)), "stop at the first rejected draft: the drafts after "
                                                                   "it followed a token the model did not choose.")
            expect(False, f"{kept} of these {len(drafts)} drafts agree with the model before the first that does not; "
                          f"you kept {n}.")
        expect(not (token == best[-1] and best[-1] != best[kept]), "the pass's own token comes from the position "
                                                                   "after the kept drafts, logits[kept], not the last one.")
        expect(token == best[kept], f"after {kept} kept drafts the pass adds argmax(logits[{kept}]) = {best[kept]}, not "
                                    f"{token} (a correction after a rejection, a bonus when every draft was kept).")
    return "the drafts kept up to the first disagreement, and the model's own token after them: exactly plain greedy."


@exercise
@hints("Three things change when a block arrives: the running maximum, the sum of exponentials, the weighted values.",
       "m_new = max(m, the block's max per row). Everything summed so far was measured against m: multiply l and o "
       "by exp(m - m_new), then add the block's exp(scores - m_new) (to l, summed; to o, times v).",
       "m_new = torch.maximum(m, scores.amax(-1, keepdim=True)); r = torch.exp(m - m_new); p = torch.exp(scores - "
       "m_new); return m_new, l * r + p.sum(-1, keepdim=True), o * r + p @ v")
def check_online_update(online_update) -> str:
    """Exercise 9.4: online_update(m, l, o, scores, v) -> the running (max, sum, weighted values) after one block."""
    online_softmax_update = tiled_attention.online_softmax_update
    library = [(tiled_attention, name) for name in ("online_softmax_update", "online_softmax", "tiled_attention")]
    expect(callable(online_update), "define a function online_update(m, l, o, scores, v) returning (m, l, o).")
    g = torch.Generator().manual_seed(11)
    scores, v = torch.randn(3, 24, generator=g) * 4, torch.randn(24, 5, generator=g)  # 3 queries, 24 keys
    scores[:, 16:] += 6  # the last block holds the largest scores: the old sums must shrink
    ours = (torch.full((3, 1), float("-inf")), torch.zeros(3, 1), torch.zeros(3, 5))
    state, normalised = ours, None
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
        if normalised is None:  # the first block sets the convention: o as a sum (FlashAttention-2) or divided by l
            normalised = not torch.allclose(o, ref[2], rtol=1e-4, atol=1e-5) and torch.allclose(
                o, ref[2] / ref[1], rtol=1e-4, atol=1e-5)
        want_o = ref[2] / ref[1] if normalised else ref[2]
        expect(torch.allclose(o, want_o, rtol=1e-4, atol=1e-5),
               "o: rescale the old o the same way as l, then add exp(scores - m_new) @ v"
               + (" (you keep o divided by l, as FlashAttention-1 does: then o_new = (o * l * exp(m_old - m_new) + "
                  "exp(scores - m_new) @ v) / l_new)." if normalised else "."))
        ours, state = ref, (m, l, o)
    out = state[2] if normalised else state[2] / state[1]
    expect(torch.allclose(out, torch.softmax(scores, -1) @ v, atol=1e-5),
           "o should equal softmax @ v." if normalised else "o / l should equal softmax @ v.")
    return ("three blocks folded one at a time give softmax(scores) @ v exactly, without ever holding all the scores"
            + ("; you kept o normalised (divided by l after every block), as FlashAttention-1 does: valid, and the "
               "output needs no division at the end, at the price of a division per block (FlashAttention-2 keeps "
               "the sum, as the notebook does, and divides once)." if normalised else "."))
