"""The scheduler's cost model: what one model call costs, calibrated from step times measured on this machine.

A served trace's latencies come from hundreds of model calls. Timed one by one on a busy machine, any of them can
stall, and a picture drawn from them (who waits for whom, where a spike comes from) can change from run to run.
So the pictures and the claims of notebook 08 follow a clock driven by a formula, fitted once to interleaved
measurements of the real model (repeats taken in rounds, their medians fitted):

    decode call   = decode_call_s  + decode_row_s * rows  + context_s * positions read
    prefill call  = prefill_call_s + prefill_token_s * tokens  + context_s * positions read
    mixed call    = prefill_call_s + prefill_token_s * tokens  + context_s * positions read

`rows` are the sequences of the call, `tokens` the new tokens it computes (padding included: a padded rectangle
computes its pad columns too), and `positions read` the cached positions its rows attend to, each row its own
(so a batch shares the weight reads, decode_call_s, but not its KV reads: claim C13). `Engine(cost=StepCost)`
advances its clock by this formula instead of the measured time; the tokens are still the real model's. A "mixed"
call (the flattened iteration of ContinuousScheduler(flatten=True): decodes and prompt chunks in one stream) is
costed as one prefill call over all its tokens: one call's overhead, each token computed once, no padding.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from ..claims import claim
from ..errors import CourseError
from ..generate.decode import decode_step, prefill
from ..measure.timing import Timing, time_interleaved


@dataclass(frozen=True)
class StepCost:
    """Seconds of one model call (see the module text); every coefficient is >= 0."""

    decode_call_s: float
    decode_row_s: float
    prefill_call_s: float
    prefill_token_s: float
    context_s: float

    def __post_init__(self):
        if any(not np.isfinite(v) or v < 0 for v in vars(self).values()):
            raise CourseError(f"Every coefficient of a StepCost must be a finite number >= 0, not {vars(self)}.")

    def __call__(self, tokens: int, rows: int, *, context: int = 0, kind: str = "decode") -> float:
        """Seconds of a call of `kind` ("prefill", "decode" or "mixed") with `rows` sequences, `tokens` new tokens
        in all and `context` cached positions read (all rows together)."""
        if kind == "decode":
            return self.decode_call_s + self.decode_row_s * rows + self.context_s * context
        if kind in ("prefill", "mixed"):  # a mixed call: one call, its decode tokens computed like prompt tokens
            return self.prefill_call_s + self.prefill_token_s * tokens + self.context_s * context
        raise CourseError(f"A model call is a 'prefill', a 'decode' or a 'mixed', not {kind!r}.")

    def decode_step_s(self, batch: int, context: int) -> float:
        """One decode step of `batch` rows of `context` cached positions each, seconds."""
        return self(batch, batch, context=batch * context, kind="decode")

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        """A one-row prefill of `tokens` new tokens after `cached` positions already in the cache, seconds."""
        return self(tokens, 1, context=cached, kind="prefill")


@dataclass
class Calibration:
    """A StepCost fitted to measurements, with the measurements kept beside it.

    decode: {(batch, context): Timing of one decode step}; prefill: {tokens: Timing of a one-row prefill};
    fit_error: the largest |predicted - measured median| / measured median over every point, 0 to 1 and more;
    kv_read: {(batch, context): bytes of K and V that one decode step handed to attention, traced (traced_kv_read)};
    kv_position_bytes: what one position of one row's cache holds in all layers, counted from the model's shapes.
    """

    cost: StepCost
    decode: dict = field(repr=False)
    prefill: dict = field(repr=False)
    fit_error: float
    kv_read: dict = field(default_factory=dict, repr=False)  # {(batch, context): bytes of K and V attention read}
    kv_position_bytes: int = 0  # bytes of K and V that one cached position holds, all layers (from the config)

    @property
    def timings(self) -> list[Timing]:
        return [*self.decode.values(), *self.prefill.values()]

    @property
    def spread(self) -> float:
        """The largest spread of any measured point (Timing.spread): how busy the machine was while it measured."""
        return max(t.spread for t in self.timings)

    def noise_warning(self) -> str:
        """The noisiest point's warning, or '' when every point's repeats agree."""
        return max((t for t in self.timings), key=lambda t: t.spread).noise_warning()


def _nonnegative_fit(columns: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a negative cost would be nonsense): drop the most negative and
    fit again, until none is left."""
    keep = list(range(columns.shape[1]))
    while True:
        coef = np.zeros(columns.shape[1])
        coef[keep] = np.linalg.lstsq(columns[:, keep], seconds, rcond=None)[0]
        if coef.min() >= 0:
            return coef
        keep.remove(int(coef.argmin()))


def fit_step_cost(decode: dict, prefill: dict) -> StepCost:
    """Fit the coefficients to measured median seconds: decode {(batch, context): s}, prefill {tokens: s} (one row,
    nothing cached). Needs at least 3 decode points of 2+ batch sizes and 2+ contexts, and 2 prefill lengths."""
    if len(decode) < 3 or len({b for b, _ in decode}) < 2 or len({c for _, c in decode}) < 2 or len(prefill) < 2:
        raise CourseError("A cost fit needs decode steps at 2+ batch sizes and 2+ contexts (3+ points), and "
                          "prefills of 2+ lengths.")
    d_cols = np.array([[1.0, b, b * c] for b, c in decode])  # [points, 3]: call, rows, positions read
    call_d, row_d, context = _nonnegative_fit(d_cols, np.array(list(decode.values())))
    p_cols = np.array([[1.0, n] for n in prefill])  # [points, 2]: call, tokens
    call_p, token_p = _nonnegative_fit(p_cols, np.array(list(prefill.values())))
    return StepCost(float(call_d), float(row_d), float(call_p), float(token_p), float(context))


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of memory a tensor view covers, each counted once: a dimension broadcast with stride 0 (expand)
    adds nothing, so 16 rows that are one row expanded count as one row."""
    if t.numel() == 0:
        return 0
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            elements *= size
    return elements * t.element_size()


def kv_position_bytes(model) -> int:
    """Bytes of K and V that one cached position of one row holds, all layers, from the model's shapes and dtype."""
    cfg = model.cfg
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=model.dtype).element_size()


def traced_kv_read(step, cache) -> int:
    """Run `step()` (one model call that attends through `cache`) and return the bytes of keys and values that
    attention was handed, every layer summed, each byte of memory counted once (distinct_bytes). Traced where the
    cache meets the kernel (`cache.attend`), so it counts what the step read, whatever the cache says it holds."""
    seen = []
    attend = cache.attend

    def traced_attend(layer, q, k, v, kernel):
        def counting_kernel(q_, k_, v_, *args, **kwargs):
            seen.append(distinct_bytes(k_) + distinct_bytes(v_))
            return kernel(q_, k_, v_, *args, **kwargs)
        return attend(layer, q, k, v, counting_kernel)

    cache.attend = traced_attend  # on this cache object only
    try:
        step()
    finally:
        del cache.attend
    return sum(seen)


def calibrate(model, batches=(1, 4, 16), contexts=(256, 1024), prompt_lengths=(16, 64, 256), *,
              max_positions: int = 16384, repeats: int = 5) -> Calibration:
    """Measure decode steps over batches x contexts (batch x context <= max_positions) and one-row prefills of
    `prompt_lengths`, all interleaved in rounds, and fit a StepCost to their medians. Each decode point is also run
    once untimed with its K and V reads traced (traced_kv_read), for C13's second half."""
    device = model.device
    work, kv_read = {}, {}
    for b in batches:
        for c in contexts:
            if b * c <= max_positions:
                cache = model.new_cache(b, c + 1)
                token = torch.zeros(b, 1, dtype=torch.long, device=device)  # [batch, 1]

                def step(cache=cache, token=token, c=c):
                    cache.length = c  # as if c positions had been prefilled: a step's time does not depend on values
                    decode_step(model, token, cache)
                with torch.inference_mode():
                    kv_read[(b, c)] = traced_kv_read(step, cache)
                work[("decode", b, c)] = step
    rng = np.random.default_rng(0)
    for n in prompt_lengths:
        ids = torch.tensor([rng.integers(3, model.cfg.vocab_size, n).tolist()], device=device)  # [1, n]
        work[("prefill", n)] = lambda ids=ids: prefill(model, ids, model.new_cache(1, ids.shape[1]))
    with torch.inference_mode():
        timings = time_interleaved(work, device, warmup=1, repeats=repeats)
    decode = {(k[1], k[2]): t for k, t in timings.items() if k[0] == "decode"}
    filled = {k[1]: t for k, t in timings.items() if k[0] == "prefill"}
    cost = fit_step_cost({k: t.median_s for k, t in decode.items()}, {k: t.median_s for k, t in filled.items()})
    errors = [abs(cost.decode_step_s(b, c) - t.median_s) / t.median_s for (b, c), t in decode.items()]
    errors += [abs(cost.prefill_s(n) - t.median_s) / t.median_s for n, t in filled.items()]
    return Calibration(cost, decode, filled, float(max(errors)), kv_read, kv_position_bytes(model))


def predicted_seconds(cost: StepCost, calls) -> float:
    """What a list of Engine.calls entries would have taken under `cost` (to compare a measured run with the model)."""
    return statistics.fsum(cost(tokens, rows, context=context, kind=kind)
                           for _, _, kind, rows, tokens, context, _ in calls)


def kv_growth(calibration: Calibration) -> dict:
    """How much a decode step grows per cached position that each of its rows reads (medians, seconds), at the
    biggest batch b measured at two contexts and at batch 1, each over the widest span of contexts measured for it
    (the more positions added, the more the KV term stands out of the noise). Returns b, the two spans, the two
    growths, and the two slopes: growth / positions added per row."""
    decode = calibration.decode

    def widest(rows):
        contexts = sorted(c for b, c in decode if b == rows)
        return (contexts[0], contexts[-1]) if len(contexts) > 1 else None

    bigger = [b for b in {b for b, _ in decode} if b > 1 and widest(b)]
    if not widest(1) or not bigger:
        raise CourseError("C13's check needs decode steps of batch 1 and of a bigger batch at two contexts each.")
    b = max(bigger)
    (lo_b, hi_b), (lo_1, hi_1) = widest(b), widest(1)
    grew_b = decode[(b, hi_b)].median_s - decode[(b, lo_b)].median_s
    grew_1 = decode[(1, hi_1)].median_s - decode[(1, lo_1)].median_s
    return {"batch": b, "span_b": (lo_b, hi_b), "span_1": (lo_1, hi_1), "grew_b": grew_b, "grew_1": grew_1,
            "slope_b": grew_b / (hi_b - lo_b), "slope_1": grew_1 / (hi_1 - lo_1)}


def claim_step_grows_less_than_batch(calibration: Calibration):
    """C13 on one calibration, both halves of the claim:

    shared weights (timed: medians of interleaved repeats): at the shortest context measured, a step of the biggest
    batch B took less than B/2 steps of one sequence. An engine that shares nothing (B one-row steps) takes B steps
    or more; the course measured 2.1-2.4x at B = 16 on idle and busy 2-core machines (the weights dominate the
    step) and 16.2-19.5x for 16 one-row steps, so B/2 lies between the two with a margin of 2x or more on each side.
    each its own cache (traced, calibration.kv_read): at every point measured, the step handed attention exactly
    batch x (context + 1) positions of K and V (the new token's included), each position kv_position_bytes: every row
    its own cache, all of it, once. Rows sharing one cache would hand it 1/batch of that; a step that read a window,
    or only the new token, less; rows that read each other's caches, more.
    Why not time the second half: per position added to each row, the clock shows how fast this machine's
    attention reads many rows against one, which varies several-fold between CPUs (a 16-row step grew 6.6-20x what
    one row grew on the course's machine, 1.8x on a CI machine with a faster memory), while a 16-row step whose rows
    share one expanded cache still grows (each row's arithmetic stays its own). The growth is printed as a reading.
    Raises ClaimFailed when either half fails."""
    context = min(c for _, c in calibration.decode)
    batches = sorted(b for b, c in calibration.decode if c == context)
    one, big = batches[0], batches[-1]
    if one != 1 or big == 1:
        raise CourseError("C13's check needs decode steps of batch 1 and of a bigger batch at the same context.")
    if not calibration.kv_read or calibration.kv_position_bytes <= 0:
        raise CourseError("C13's second half needs the K and V reads traced at each decode point (calibrate() "
                          "records them in Calibration.kv_read).")
    t_one, t_big = calibration.decode[(1, context)].median_s, calibration.decode[(big, context)].median_s
    shared = t_big < big / 2 * t_one
    per = calibration.kv_position_bytes
    expected = {(b, c): b * (c + 1) * per for b, c in calibration.kv_read}
    wrong = {k: v for k, v in calibration.kv_read.items() if v != expected[k]}
    own = not wrong
    b, c = max(calibration.kv_read, key=lambda k: (k[0], k[1]))  # the biggest batch at its longest context
    read = calibration.kv_read[(b, c)]
    if own:
        traced = (f"at every one of the {len(expected)} points measured, a step of b rows at c cached positions "
                  f"handed attention exactly b x (c + 1) x {per:,} bytes of K and V (traced; {b} rows at {c:,}: "
                  f"{read / 1e6:,.1f} MB, {read / (c + 1) / per:g} rows' worth): each row reads its own cache")
    else:
        (wb, wc), got = next(iter(wrong.items()))
        traced = (f"a step of {wb} rows at {wc:,} cached positions handed attention {got:,} bytes of K and V "
                  f"(traced), {got / ((wc + 1) * per):.2f} rows' worth, where {wb} rows each reading its own cache "
                  f"read {expected[(wb, wc)]:,} ({len(wrong)} of {len(expected)} points differ)")
    return claim("C13", shared and own,
                 f"at {context:,} tokens of context, a decode step of {big} rows took {t_big / t_one:.1f}x the step of "
                 f"one ({t_big * 1e3:.0f} vs {t_one * 1e3:.0f} ms, medians of interleaved repeats; below {big / 2:g}x: "
                 f"{shared}, where {big} one-row steps would take {big}x), so the batch made "
                 f"{big * t_one / t_big:.1f}x the tokens/s; {traced}; own caches: {own}, where rows sharing one cache "
                 f"would read one row's worth")
