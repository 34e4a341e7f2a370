"""Checks for notebook 07 (prefill and decode): the FLOPs and bytes of one decode step, the batch at which decode
reaches the ridge point (predicted, then measured), a step's three lower bounds and its regime, and the floor under
a decode step at any batch and context (the prediction the batch x context table is read against).

The work count is checked against llm_anatomy.measure.forward_work on model shapes the notebook never used.
"""

from __future__ import annotations


from ..measure import overhead, roofline
from ..measure.overhead import REGIMES, regime, regime_times
from ..measure.peaks import Peaks
from ..measure.roofline import Work, block_parameters, forward_work, ridge_batch
from ..weights.random import RANDOM_SHAPES
from ..model.scratch import ScratchConfig
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)


def _config(shape: dict) -> ScratchConfig:
    return ScratchConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], num_layers=shape["num_hidden_layers"],
                         num_heads=shape["num_attention_heads"], num_kv_heads=shape["num_key_value_heads"],
                         head_dim=shape["head_dim"], rope_theta=shape["rope_theta"], rms_norm_eps=shape["rms_norm_eps"],
                         max_position_embeddings=shape["max_position_embeddings"],
                         tie_word_embeddings=shape["tie_word_embeddings"])


def _unseen_configs() -> list[tuple[str, ScratchConfig]]:
    odd = dict(RANDOM_SHAPES["360m"], vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
               num_attention_heads=16, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)
    return [("a 1B-shaped Llama", _config(RANDOM_SHAPES["1b"])), ("SmolLM2-360M's shape", _config(RANDOM_SHAPES["360m"])),
            ("an 8-layer model with 4 KV heads", _config(odd))]


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    """Equal but for float rounding: the counts are whole numbers, so an off-by-one position must not pass."""
    return abs(a - b) <= rel * abs(b)


def _counted(want: float, got: float, unit: str) -> str:
    """Both counts in full, and how far apart: at 4 digits an off-by-a-little count reads as the right one."""
    return f"{want:,.0f} {unit}, got {got:,.0f} ({got - want:+,.0f}, {got / want - 1:+.2e} of it)"


@exercise
@hints("Go through the table above: each matmul does 2 FLOPs per weight per token and reads each weight once.",
       "Add the LM head (vocab x hidden, one position), attention's two matmuls over the past + 1 positions "
       "(4 x layers x heads x head_dim x positions FLOPs), and the KV cache it reads: 2 x layers x kv_heads x "
       "head_dim x bytes per number, per position.",
       "per_layer = d*q + 2*d*kv + q*d + 3*d*intermediate (q = heads*head_dim, kv = kv_heads*head_dim); weights = "
       "layers * per_layer + vocab * d; positions = past + 1; flops = 2 * weights + 4 * L * H * head_dim * positions; "
       "bytes = weights * bytes_per_element + 2 * L * kv * bytes_per_element * positions")
def check_decode_work(decode_work) -> str:
    """decode_work(cfg, past, bytes_per_element) -> (FLOPs, bytes) of one decode step, batch 1, after `past` tokens."""
    expect(callable(decode_work), "define decode_work(cfg, past, bytes_per_element) returning (flops, bytes).")
    library = [(roofline, "forward_work"), (roofline, "block_parameters"), (roofline, "matmul_parameters"),
               (roofline, "pass_rows")]  # pass_rows: the table above the exercise, row by row
    for name, cfg in _unseen_configs():
        for past, size in ((1000, 2), (300, 4), (0, 2)):
            with forbidden_all(library, "count the table's rows yourself: the work count is the exercise"):
                got = returned(call(decode_work, cfg, past, size), "pair", "(flops, bytes)")
            flops, moved = (returned(x, "number", "the FLOPs and the bytes") for x in got)
            want = forward_work(cfg, 1, past, 1, size)
            L, H, K, d = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
            block, head, n = block_parameters(cfg), cfg.vocab_size * cfg.hidden_size, past + 1
            attn, kv = 4 * L * H * d * n, 2 * L * K * d * size * n
            where = f"{name} after {past} tokens in {8 * size}-bit numbers"
            if not _close(flops, want.flops):
                for wrong, why in ((2 * (block + head) + attn * past / n, "the new token attends to the past "
                                                                          "positions AND to itself: past + 1 "
                                                                          "positions, not past."),
                                   (block + head + attn / 2, "a weight does a multiply AND an add per token: 2 FLOPs, "
                                                             "not 1."),
                                   (2 * block + attn, "you left out the LM head, vocab x hidden weights that turn the "
                                                      "last hidden state into logits."),
                                   (2 * block + 2 * head, "you left out attention's own FLOPs: q.k and weights.v over "
                                                          "every cached position and the new one.")):
                    expect(not _close(flops, wrong), f"{where}: {why}")
                expect(False, f"{where}: expected {_counted(want.flops, flops, 'FLOPs')}.")
            if not _close(moved, want.bytes):
                weights = (block + head) * size
                for wrong, why in ((weights + kv * past / n, "the step reads the K and V of the past positions and "
                                                             "writes its own: past + 1 positions of cache, not past."),
                                   (weights, "the weights are not all: the step also reads the KV cache of every "
                                             "earlier position (and writes its own)."),
                                   (weights + kv / 2, "the cache holds a key AND a value per position: multiply by 2."),
                                   (weights + kv * H / K, "the cache holds kv_heads heads (GQA), not one per query "
                                                          "head."),
                                   (weights + head * size + kv, "the embedding lookup reads one row, not the table: "
                                                                "count vocab x hidden once, for the LM head."),
                                   (block * size + kv, "the LM head's weights are read too.")):
                    expect(not _close(moved, wrong), f"{where}: {why}")
                expect(False, f"{where}: expected {_counted(want.bytes, moved, 'bytes')}.")
    return "the weights dominate both counts at short contexts: about 2 FLOPs per weight read, whatever the model."


@exercise
@hints("A batch of b sequences does b times the FLOPs of one, but reads the weights only once.",
       "With short contexts the weights dominate the bytes: intensity(b) ~ 2 x b x parameters / (parameters x bytes "
       "per number) = 2b / bytes per number. Set it equal to the ridge.",
       "answer = ridge * bytes_per_element / 2, rounded up (a little more once the KV cache counts)")
def check_ridge_batch(answer, cfg, past: int, bytes_per_element: int, ridge: float) -> str:
    """The batch size at which decode (after `past` tokens) reaches the machine's ridge point, predicted."""
    expect(answer is not None, "assign your prediction, a number of sequences, to the variable in the cell "
                               "(`ridge_guess`).")
    answer = returned(answer, "number", "a number of sequences, such as 16")
    right = ridge_batch(cfg, past, bytes_per_element, ridge)
    expect(right is not None, "at this context the KV cache grows as fast as the FLOPs: no batch reaches the ridge.")
    expect(answer >= 1, "a batch holds at least one sequence.")
    if 1.6 * right <= answer <= 2.5 * right:
        expect(False, f"{answer:g} is about twice too big: each weight does 2 FLOPs per sequence (a multiply and an "
                      "add), so intensity ~ 2 x batch / bytes per number.")
    if right / 2.5 <= answer <= right / 1.6:
        expect(False, f"{answer:g} is about half the answer: intensity ~ 2 x batch / bytes per number, so "
                      "batch ~ ridge x bytes per number / 2. Did you take 1 FLOP per weight, or the wrong bytes?")
    expect(0.75 * right <= answer <= 1.33 * right,
           f"{answer:g} is off: solve 2 x batch / {bytes_per_element} (bytes per number) = {ridge:.1f} (the ridge).")
    return f"about {right} sequences: below that, more sequences cost almost nothing; above it, the arithmetic does."


# (what the step is, FLOPs, bytes, ops, peak FLOP/s, bandwidth bytes/s, seconds per op): one of each regime, and
# machines the notebook never measured
_STEPS = [("a long prefill on a big GPU", 2.4e13, 6.1e9, 900, 7.0e14, 3.3e12, 4e-6),
          ("a 7B model's decode step on a laptop", 1.4e10, 1.4e10, 1100, 2.0e12, 1.0e11, 6e-6),
          ("a small model's decode step on a GPU", 2.7e8, 2.7e8, 1500, 1.5e14, 2.0e12, 5e-6),
          ("a tiny model on a slow CPU", 3.0e5, 6.0e5, 40, 5.0e10, 1.0e10, 2e-5)]


@exercise
@hints("Each resource alone sets a floor on the time: how long would the step take if only the arithmetic "
       "counted? Only the bytes? Only the number of ops?",
       "compute = FLOPs / peak FLOP/s, memory = bytes / bandwidth, overhead = ops x seconds per op; all three are "
       "seconds. The step can be no faster than the slowest of them.",
       "bounds = {'compute': flops / peak_flops, 'memory': bytes_moved / bandwidth, 'overhead': ops * per_op_s}; "
       "return bounds, max(bounds, key=bounds.get)")
def check_step_bounds(step_bounds) -> str:
    """step_bounds(flops, bytes_moved, ops, peak_flops, bandwidth, per_op_s) -> (bounds in seconds, regime name)."""
    expect(callable(step_bounds), "define step_bounds(flops, bytes_moved, ops, peak_flops, bandwidth, per_op_s).")
    seen = set()
    for what, flops, moved, ops, peak, bandwidth, per_op in _STEPS:
        want = regime_times(Work(flops, moved), ops, Peaks("cpu", "fp32", peak, bandwidth, "given"), per_op)
        with forbidden_all([(overhead, "regime_times"), (overhead, "regime")], "compute the three bounds and pick "
                                                                              "the regime yourself"):
            got = returned(call(step_bounds, flops, moved, ops, peak, bandwidth, per_op), "pair",
                           "(a dict of the three bounds in seconds, the regime's name)")
        bounds, name = got
        expect(isinstance(bounds, dict), f"the first thing to return is a dict of the three bounds in seconds, "
                                         f"{{'compute': ..., 'memory': ..., 'overhead': ...}}, not "
                                         f"{type(bounds).__name__}.")
        expect(set(bounds) == set(REGIMES), f"the dict's keys must be {list(REGIMES)}, not {sorted(bounds)}.")
        for key in REGIMES:
            value = returned(bounds[key], "number", f"the {key} bound (seconds)")
            if _close(value, want[key]):
                continue
            wrong = {"compute": (flops * peak, "compute: FLOPs / FLOP/s gives seconds; you multiplied."),
                     "memory": (moved * bandwidth, "memory: bytes / (bytes/s) gives seconds; you multiplied."),
                     "overhead": (ops / per_op, "overhead: ops x seconds per op, not ops / seconds per op.")}[key]
            expect(not _close(value, wrong[0]), f"{what}: {wrong[1]}")
            if key == "compute":
                expect(not _close(value, flops / bandwidth), f"{what}: divide the FLOPs by the peak FLOP/s, "
                                                             "not by the bandwidth.")
            if key == "memory":
                expect(not _close(value, moved / peak), f"{what}: divide the bytes by the bandwidth, not by the "
                                                        "peak FLOP/s.")
            expect(False, f"{what}: the {key} bound should be {want[key]:.3g} s, got {value:.3g} s.")
        right = regime(want)
        name = returned(name, "text", "the regime's name ('compute', 'memory' or 'overhead')")
        if name.removesuffix("-bound").removesuffix(" bound").strip().lower() == right and name != right:
            expect(False, f"{what}: {name!r} is the right regime, but name it by its key, {right!r}, as the dict's "
                          "keys do (the table adds '-bound' when it prints it).")
        if name == min(REGIMES, key=want.get) and name != right:
            expect(False, f"{what}: you named the smallest bound ({name}); the step can be no faster than the "
                          f"LARGEST, so it is {right}-bound.")
        expect(name == right, f"{what}: the largest bound is {right}, so the step is {right}-bound, not {name!r}.")
        seen.add(right)
    expect(seen == set(REGIMES), "internal: the checks should cover every regime.")
    return ("a step is bound by whichever floor is highest: the roofline alone misses the third one, the cost of "
            "issuing each op.")


_MACHINES = {"an H100-class GPU": (3.35e12, 9.9e14), "a T4": (3.0e11, 6.5e13), "a laptop CPU": (6.0e10, 1.0e12),
             "one slow CPU core": (2.0e10, 5.0e9)}
_MODELS = {"Llama-3-8B in bf16": (16.06e9, 131_072, 8.03e9), "a 1B model in bf16": (2.47e9, 32_768, 1.24e9),
           "a 360M model in int8": (0.36e9, 15_360, 0.36e9)}  # weight bytes, KV bytes per token, parameters
_GRID = [(1, 512), (8, 4096), (64, 1024), (1024, 16), (256, 8)]  # (batch, context): both regimes


@exercise
@hints("Two floors: the bytes the step must read over the bandwidth, and the FLOPs it must do over the peak. Which "
       "bytes are shared by the batch, and which does every sequence bring?",
       "The weights are read once per step for the whole batch; each sequence reads its own cache, context x KV bytes "
       "per token. Every sequence's token does 2 FLOPs per parameter. The step takes at least the larger floor.",
       "memory = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth; compute = 2 * batch * params / "
       "flops_per_s; return max(memory, compute)")
def check_predict_step(predict_step_s) -> str:
    """predict_step_s(batch, context, weight_bytes, kv_bytes_per_token, params, bandwidth, flops_per_s) -> the
    predicted decode step time in seconds, on machines and models the notebook never measured."""
    expect(callable(predict_step_s), "define predict_step_s(batch, context, weight_bytes, kv_bytes_per_token, params, "
                                     "bandwidth, flops_per_s) returning seconds.")
    library = [(roofline, "predict_decode_step_s"), (roofline, "forward_work"), (overhead, "regime_times")]
    regimes = set()
    for machine, (bw, fl) in _MACHINES.items():
        for model, (w, kv, n) in _MODELS.items():
            for b, c in _GRID:
                with forbidden_all(library, "add up the bytes and the FLOPs yourself: the prediction is the exercise"):
                    got = returned(call(predict_step_s, b, c, w, kv, n, bw, fl), "number", "the step time in seconds")
                memory, compute = (w + b * c * kv) / bw, 2 * b * n / fl
                want = roofline.predict_decode_step_s(b, c, w, kv, n, bw, fl)
                regimes.add("memory" if memory >= compute else "compute")
                if _close(got, want, 1e-6):
                    continue
                where = f"for batch {b} at context {c} on {machine}, {model}"
                for wrong, message in [
                        (max((w + b * (c + 1) * kv) / bw, compute), "use context, not context + 1: here `context` is "
                                                                    "every position each sequence's cache holds (the "
                                                                    "table's column), so the bytes are weights + "
                                                                    "batch x context x kv_bytes_per_token."),
                        (max((w + c * kv) / bw, compute), "each sequence reads its OWN cache: multiply the KV bytes "
                                                          "by the batch as well as the context."),
                        (max((b * w + b * c * kv) / bw, compute), "the weights are read once per step for the whole "
                                                                  "batch: do not multiply them by the batch."),
                        (memory + compute, "the step is at least each floor, and the two overlap: take the larger "
                                           "(max), not their sum."),
                        (max(memory, b * n / fl), "every parameter does 2 FLOPs per token (a multiply and an add)."),
                        (memory, "you left out the arithmetic floor, or did not multiply it by the batch: every "
                                 "sequence's token does 2 x params FLOPs, and at a large batch (or on a slow core) "
                                 "they take longer than the bytes."),
                        (max(memory, 2 * n / fl), "every sequence's token does 2 x params FLOPs: multiply by the batch."),
                        (max(w / bw, compute), "you left out the KV cache: batch x context x KV bytes per token are "
                                               "read too."),
                        (min(memory, compute), "a floor is the LARGER of the two: the step cannot beat either one.")]:
                    expect(not _close(got, wrong, 1e-6), f"{where}: {message}")
                digits = next(n for n in range(3, 12) if f"{want * 1e3:.{n}f}" != f"{got * 1e3:.{n}f}" or n == 11)
                expect(False, f"{where} the floor is {want * 1e3:.{digits}f} ms (bytes {memory * 1e3:.{digits}f} ms, "
                              f"FLOPs {compute * 1e3:.{digits}f} ms), you predicted {got * 1e3:.{digits}f} ms.")
    expect(regimes == {"memory", "compute"}, "internal: the cases should cover both floors.")
    return "the weights are shared by the batch, the caches are not: the table below is this formula, measured."
