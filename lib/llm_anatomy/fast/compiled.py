"""The packed decode step compiled as one graph: torch.compile (inductor) on a CPU (claim C20's CPU half, issue 51).

An eager int4 step of the small model calls some 1,600 aten ops from Python (bench fast's step_split: 1,583): each
goes through Python and the dispatcher, and most do little work (a norm of 576 numbers, a cast to bf16 and back
around every packed matmul, RoPE on one row). The packed matmuls themselves are a third of the step or so (notebook
09 measures it): the rest is overhead, not bytes. Compiling removes a large part of it (about half, measured):

    step = torch.compile(greedy_decode_step, dynamic=True, fullgraph=True)
    token = step(model, token, cache)     # decode_step and the argmax: one graph, token in, token out

- **decode_step itself** is compiled, over the ordinary KVCache (fixed shapes, `max_len` slots): attention reads
  only the filled positions, since `dynamic=True` makes the cache's length a symbolic size, so one graph serves
  every length (a fixed-shape step that reads every slot under a mask was 10% slower eagerly);
- the activations stay in **bf16 inside the graph**: inductor fuses each cast to bf16 into the norm before the
  packed matmul, and the cast back into the residual add after it, so the casts cost nothing of their own;
- **Python leaves the step** as far as inductor takes it: one call of the generated code per token, which calls the
  packed kernels (`_weight_int4pack_mm_for_cpu`, extern to inductor) and its own fused C++ loops between them.
  `cpp_wrapper=True` writes that calling code in C++ too (the bench measures what it buys; notebook 09 does not,
  since it takes longer to compile).

`fullgraph=True` makes a graph break an error instead of a silent fallback to Python, and so does CompiledDecoder
for dynamo's recompile limit (past it, dynamo would run the step eagerly, silently). What is
compiled needs a C++ compiler (inductor writes C++ and builds it): `compiler_status` says whether one is here.
The compiled kernels are cached on disk (TORCHINDUCTOR_CACHE_DIR; notebook 09 keeps them in the course's cache), so
a second compile of the same step is "warm": dynamo traces again, the C++ is not rebuilt.
Times in seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch

from ..device import timed
from ..errors import CourseError
from ..generate.decode import decode_step, prefill

COMPILERS = ("g++", "c++", "clang++")


def compiler_status() -> tuple[bool, str]:
    """(True, the C++ compiler's path) when inductor can build its kernels here, else (False, why in one sentence).
    The compiler is $CXX when set, else the first of g++, c++, clang++ on the PATH."""
    named = os.environ.get("CXX")
    found = shutil.which(named) if named else next((shutil.which(c) for c in COMPILERS if shutil.which(c)), None)
    if found is None:
        wanted = f"$CXX ({named})" if named else ", ".join(COMPILERS)
        return False, (f"no C++ compiler ({wanted}) on this machine: torch.compile's inductor writes C++ kernels and "
                       "builds them (install g++, e.g. `apt install g++`, or Xcode's command-line tools)")
    return True, found


def greedy_decode_step(model, token: torch.Tensor, cache) -> torch.Tensor:
    """One greedy decode step, token `[1, 1]` in, the next token `[1, 1]` out: decode_step, then the argmax, with no
    value read back to Python (the ids are the model's own choice: check_range=False), so it traces as one graph."""
    out = decode_step(model, token, cache, check_range=False)
    return out.logits[:, -1:].argmax(-1)


@contextlib.contextmanager
def inductor_cache(path: str | os.PathLike | None):
    """Inductor's on-disk cache in `path`, a folder that exists, for the block (None: leave it where it is)."""
    if path is None:
        yield
        return
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def end_compile_workers() -> None:
    """Stop the threads and processes inductor started to build kernels in parallel (it keeps them for the next
    compile): a compile leaves nothing running behind it."""
    from torch._inductor import async_compile

    pool = async_compile.AsyncCompile.pool
    if pool.cache_info().currsize:
        pool().shutdown(wait=True)
        pool.cache_clear()
    async_compile.shutdown_compile_workers()


class CompiledDecoder:
    """Greedy decoding of batch 1 with `greedy_decode_step` compiled by inductor.

    model: a ScratchLlama (the packed int4 model, in the course; any one works); max_len: the cache's slots (prompt
    and new tokens); cpp_wrapper: inductor's C++ wrapper (the calls between kernels in C++, not Python); cache_dir:
    where inductor keeps what it builds (None: its default). The first step compiles (`compile_s`, set by `warm_up`
    or the first `generate`); later steps run the compiled graph. Raises CourseError without a C++ compiler.
    """

    def __init__(self, model, max_len: int, *, cpp_wrapper: bool = False, cache_dir: str | os.PathLike | None = None):
        ok, why = compiler_status()
        if not ok:
            raise CourseError(f"Cannot compile the decode step: {why}.")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
            raise CourseError(f"max_len must be a whole number of slots >= 2 (a prompt token and a new one), not "
                              f"{max_len!r}.")
        self.model, self.cache_dir, self.cpp_wrapper = model, cache_dir, cpp_wrapper
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
        with torch.inference_mode():  # the steps run under inference_mode: the cache they write must be made under it
            self.cache = model.new_cache(1, max_len)
        self._step = torch.compile(greedy_decode_step, dynamic=True, fullgraph=True,
                                   options={"cpp_wrapper": cpp_wrapper})
        self.compile_s: float | None = None

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """The prompt `[1, seq]` through the ordinary (eager) prefill; the first new token `[1, 1]`."""
        if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1:
            shape = tuple(prompt_ids.shape) if isinstance(prompt_ids, torch.Tensor) else type(prompt_ids).__name__
            raise CourseError(f"The compiled decoder takes one prompt, ids of shape [1, seq], not {shape}.")
        if prompt_ids.shape[1] + 1 > self.max_len:
            raise CourseError(f"A {prompt_ids.shape[1]}-token prompt and one new token do not fit the decoder's "
                              f"{self.max_len} slots.")
        self.cache.reset()
        return prefill(self.model, prompt_ids, self.cache).logits[:, -1:].argmax(-1)

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One compiled decode step after the cache's positions: the next token `[1, 1]`. The first call compiles."""
        if self.cache.length == 0:
            raise CourseError("The cache is empty: prefill the prompt before the first decode step.")
        if self.cache.length >= self.max_len:
            raise CourseError(f"The decoder's {self.max_len} slots are full.")
        if self.compile_s is not None:
            if self.cache_dir is None:
                return self._step(self.model, token, self.cache)
            with inductor_cache(self.cache_dir):  # after a torch._dynamo.reset() it compiles again, warm, from there
                return self._step(self.model, token, self.cache)
        import torch._dynamo as dynamo

        def first():  # past dynamo's recompile limit, an error, not a silent eager run
            with inductor_cache(self.cache_dir), dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return self._step(self.model, token, self.cache)

        try:
            self.compile_s, out = timed(first, self.model.device)
        finally:
            end_compile_workers()
        return out

    def warm_up(self, prompt_ids: torch.Tensor) -> float:
        """Compile (on the first call) by running one step after `prompt_ids`: the seconds that first step took."""
        self.step(self.prefill(prompt_ids))
        return self.compile_s

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy tokens `[1, new_tokens]`, the first from the (eager) prefill, the rest from compiled steps."""
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
            raise CourseError(f"new_tokens must be a whole number >= 1, not {new_tokens!r}.")
        if prompt_ids.shape[-1] + new_tokens > self.max_len:
            raise CourseError(f"{prompt_ids.shape[-1]} prompt tokens + {new_tokens} new ones do not fit the "
                              f"decoder's {self.max_len} slots.")
        token = self.prefill(prompt_ids)
        out = [token]
        for _ in range(new_tokens - 1):
            token = self.step(token)
            out.append(token)
        return torch.cat(out, dim=1)

    def one_step(self, prompt_ids: torch.Tensor):
        """A function that runs one compiled step after `prompt_ids` [1, seq], the cache rewound at every call (the
        prefill runs once, here), as packed.one_step does for the eager step: the two are timed in turns."""
        token = self.prefill(prompt_ids)
        length = self.cache.length

        def step():
            self.cache.length = length
            self.step(token)
        return step


def compile_cache() -> Path:
    """Where the course keeps inductor's compiled kernels: `inductor` in the course's cache folder (weights/cache.py),
    so that notebook 09, its tests and a second run find the decode step built."""
    from ..weights.cache import cache_dir

    return cache_dir() / "inductor"


RECORDS = "llm_anatomy_compiles.json"  # in the cache folder: the cold compiles measured there, by step


def _step_key(model, cpp_wrapper: bool) -> str:
    """What a compiled step's kernels depend on: the model's shapes and layers' kinds, the wrapper, torch, threads."""
    kinds = sorted({type(m).__name__ for m in model.modules()})
    return json.dumps([repr(model.cfg), kinds, cpp_wrapper, torch.__version__, torch.get_num_threads()])


def compile_times(model, prompt_ids: torch.Tensor, cache_dir: str | os.PathLike, *, cpp_wrapper: bool = False,
                  max_len: int | None = None) -> dict:
    """The compile's cost, cold and warm, seconds: {"cold_s", "warm_s", "cold_measured_now", "cold_recorded_at",
    "decoder"}.

    cold: the first step's seconds when `cache_dir` has never held this step (the folder keeps a record of the cold
    compiles measured in it, RECORDS); then dynamo is reset and the step compiled again: warm, traced again with
    its kernels found built. When the folder already holds the step, only the warm compile runs, and the cold
    figure is the one recorded when the folder was filled (cold_measured_now False, cold_recorded_at its date): one
    compile instead of two. Returns the last decoder ("decoder"), compiled and ready to time.
    """
    import torch._dynamo as dynamo

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    records_file, key = cache_dir / RECORDS, _step_key(model, cpp_wrapper)
    try:
        records = json.loads(records_file.read_text())
    except (OSError, ValueError):
        records = {}  # none yet, or a damaged file: measure again
    record = records.get(key) if isinstance(records, dict) else None
    max_len = max_len or prompt_ids.shape[1] + 2
    out = {}
    for name in (("warm",) if isinstance(record, dict) and "cold_s" in record else ("cold", "warm")):
        dynamo.reset()
        decoder = CompiledDecoder(model, max_len, cpp_wrapper=cpp_wrapper, cache_dir=cache_dir)
        out[f"{name}_s"] = decoder.warm_up(prompt_ids)
    if "cold_s" in out:
        records = {**(records if isinstance(records, dict) else {}),
                   key: {"cold_s": out["cold_s"], "at": time.strftime("%Y-%m-%d %H:%M")}}
        records_file.write_text(json.dumps(records, indent=1))
        out.update(cold_measured_now=True, cold_recorded_at=records[key]["at"])
    else:
        out.update(cold_s=record["cold_s"], cold_measured_now=False, cold_recorded_at=record.get("at", "?"))
    return {**out, "decoder": decoder}


# What notebook 09 shows where it cannot compile (no C++ compiler, no packed int4 kernel, or a GPU): the run on the
# course's test machine. Steps alone, timed in turns, 128 tokens; the compiles with an empty cache in a fresh process.
RECORDED = {"machine": "the course's 2-core test machine (AMD EPYC with AVX-512, PyTorch 2.13, idle)",
            "eager_tokens_per_s": 77.3, "compiled_tokens_per_s": 116.6, "cold_s": 44.8, "warm_s": 12.5,
            "source": "`python -m llm_anatomy bench fast --json`, compiled.by_wrapper.python, 2026-12-07"}


# --------------------------------------------------------------------------- C20's CPU half (notebook 09, section 4.3)

# Measured on the 2-core test machine (idle: torch on 2 threads; one core burned: on 1, as the course's thread policy
# sets it), each side the fastest of 15 steps in turns, the real model's packed int4 step: eager 2.15-2.21x its packed
# kernels alone idle, 1.74x busy; compiled 0.71-0.72x the eager step idle, 0.77-0.78x busy. The false worlds: an eager
# step already at its kernels' bound (two layers of 2,048 x 8,192 matrices, whose step is its big matmuls) 1.18-1.33x
# its kernels, and compiling buys it 0.92-0.95x; a "compiled" step that runs eagerly (backend="eager": traced, not
# compiled) 0.93x the eager one.
OVERHEAD_BAR = 1.5  # the eager step must take at least this many times its packed kernels alone
COMPILED_BAR = 0.85  # the compiled step must take at most this share of the eager one


def time_packed_kernels(model, step, *, repeats: int = 15):
    """The packed kernels of one call of `step()` alone, the Timing of a pass through all of them (read min_s): each
    PackedProjection's kernel called on a ready input of the shape and dtype it got (bf16 rows), in the step's order,
    without the casts around it. What reads the weights' bytes; everything else of the step is overhead to them."""
    from ..measure.step_parts import layer_calls
    from ..measure.timing import time_it
    from .packed import PackedProjection

    layers = [m for m in model.modules() if isinstance(m, PackedProjection)]
    if not layers:
        raise CourseError("This model has no packed layers: pack() it first.")
    rows, inputs = {}, []  # one ready input per shape and dtype, [tokens, in] in the kernel's dtype, shared
    for layer, x, _ in layer_calls(layers, step):
        key = (math.prod(x.shape[:-1]), x.shape[-1], layer.activations)
        if key not in rows:
            rows[key] = torch.randn(key[:2], device=model.device).to(key[2])
        inputs.append((layer, rows[key]))

    def one_pass():
        with torch.inference_mode():
            for layer, x in inputs:
                layer.matmul(x)

    return time_it(one_pass, model.device, warmup=1, repeats=repeats)


def time_eager_and_compiled(model, decoder: CompiledDecoder, prompt_ids: torch.Tensor, *, repeats: int = 15) -> dict:
    """The three times C20's CPU half reads, seconds: the eager packed step and the compiled one after `prompt_ids`,
    timed in turns (the fastest of `repeats` each: a busy moment slows both alike and can only add time), and the
    eager step's packed kernels alone (time_packed_kernels: what reads the weights' bytes)."""
    from ..measure.timing import time_interleaved
    from .packed import one_step

    eager = one_step(model, prompt_ids)
    with torch.inference_mode():
        timings = time_interleaved({"eager": eager, "compiled": decoder.one_step(prompt_ids)}, model.device,
                                   warmup=2, repeats=repeats)
        kernels = time_packed_kernels(model, eager, repeats=repeats)
    return {"eager_s": timings["eager"].min_s, "compiled_s": timings["compiled"].min_s, "kernels_s": kernels.min_s,
            "timings": timings}


def overhead_evidence(eager_s: float, kernels_s: float, compiled_s: float, same_tokens: bool,
                      overhead_bar: float = OVERHEAD_BAR, compiled_bar: float = COMPILED_BAR) -> tuple[bool, str]:
    """C20's CPU half: overhead, not bytes, bounds the small eager step, and compilation removes it.

    eager_s: the eager packed step; kernels_s: its packed kernels timed alone (time_packed_kernels: what reads the
    weights' bytes); compiled_s: the compiled step, timed in turns with the eager one; same_tokens: whether the
    compiled path gave the eager path's greedy tokens. Holds when the eager step took at least `overhead_bar` times
    its kernels (what is not a packed kernel, the casts, the small ops and their dispatch, is a third of the step or
    more), the compiled step at most `compiled_bar` of the eager one, and the tokens are the same. An eager step
    already at its kernels' bound fails the first bar, and a "compiled" step that is not faster the second.
    """
    for name, value in (("eager_s", eager_s), ("kernels_s", kernels_s), ("compiled_s", compiled_s)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise CourseError(f"{name} must be a positive number of seconds, not {value!r}.")
    bound, gain = eager_s / kernels_s, compiled_s / eager_s
    holds = bound >= overhead_bar and gain <= compiled_bar and bool(same_tokens)
    removed = (f", {(eager_s - compiled_s) / (eager_s - kernels_s):.0%} of the eager step's time outside its kernels"
               if eager_s > kernels_s else "")
    return holds, (f"the eager step took {eager_s * 1e3:.1f} ms, {bound:.2f}x its packed kernels alone "
                   f"({kernels_s * 1e3:.1f} ms; bar: at least {overhead_bar:.1f}x, so {1 - 1 / bound:.0%} of it is "
                   f"not the kernels that read the bytes); the compiled step took {compiled_s * 1e3:.1f} ms, "
                   f"{gain:.2f}x the eager one (bar: at most {compiled_bar:.2f}x): compiling removed "
                   f"{(eager_s - compiled_s) * 1e3:.1f} ms{removed}, "
                   + ("with the same greedy tokens" if same_tokens else "but NOT the same greedy tokens"))
