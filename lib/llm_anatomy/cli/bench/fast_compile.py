"""bench fast's compiled steps: the packed int4 decode step compiled as one graph on a CPU (issue 51), and the fastest
model's fixed-shape step compiled (--compile) or, on a GPU, replayed from a CUDA graph. Seconds and tokens/s."""

from __future__ import annotations

import statistics

import torch

from ...device import timed
from ...errors import CourseError
from ...fast.compiled import compile_times, compiler_status
from ...fast.fused import compile_step
from ...generate.decode import StaticDecoder, generate_greedy
from ...measure.timing import time_it


def compiled_step(model, prompt, n: int, dev, turns: int) -> dict:
    """The packed step compiled (fast/compiled.py) with inductor's C++ wrapper, then its Python one: each compile
    cold (an empty cache; the second wrapper's in a process that has built the same kernels once, so partly warm:
    "cold_after" says so) and warm (traced again, the kernels found built); its median step over `n` tokens timed in
    `turns` turns with the eager packed step's (one wrapper at a time: compiling the next resets dynamo); whether its
    `n` greedy tokens equal the eager path's."""
    import tempfile

    ok, why = compiler_status()
    if not ok:
        return {"error": why}
    eager_tokens = generate_greedy(model, prompt, n).tokens.cpu()
    out = {"new_tokens": n, "by_wrapper": {}}

    def eager():
        return statistics.median(generate_greedy(model, prompt, n, timed=True).step_seconds[1:])

    def compiled(decoder):
        token, times = decoder.prefill(prompt), []
        for _ in range(n - 1):
            seconds, token = timed(lambda token=token: decoder.step(token), dev)
            times.append(seconds)
        return statistics.median(times)

    with tempfile.TemporaryDirectory(prefix="llm-anatomy-inductor-") as tmp:
        for wrapper in ("cpp", "python"):  # the C++ one first: its cold compile is the truly cold one of the two
            try:
                times = compile_times(model, prompt, f"{tmp}/{wrapper}", cpp_wrapper=wrapper == "cpp",
                                      max_len=prompt.shape[1] + n + 1)
            except Exception as err:  # noqa: BLE001  a compiler that fails here: say so, keep the other figures
                out["by_wrapper"][wrapper] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
                continue
            decoder = times.pop("decoder")
            same = torch.equal(decoder.generate(prompt, n).cpu(), eager_tokens)
            eager(), compiled(decoder)  # warm-up
            seconds = {"eager": [], wrapper: []}
            for _ in range(turns):  # in turns: a busy moment slows both alike
                seconds["eager"].append(eager())
                seconds[wrapper].append(compiled(decoder))
            speed = {name: 1 / statistics.median(s_) for name, s_ in seconds.items()}
            out["by_wrapper"][wrapper] = {
                **times, "cold_after": [w for w in out["by_wrapper"] if w != wrapper], "same_tokens": same,
                "step_tokens_per_s": speed[wrapper], "eager_step_tokens_per_s": speed["eager"],
                "speedup": speed[wrapper] / speed["eager"],
                "per_turn_tokens_per_s": {name: [round(1 / x, 1) for x in s_] for name, s_ in seconds.items()}}
    return out


def static_step(model, prompt, n, dev, compile_: bool, reps: int) -> dict:
    decoder = StaticDecoder(model, 1, prompt.shape[1] + n + 1)
    decoder.prefill(prompt)
    steps = lambda: [decoder.step() for _ in range(n)]  # noqa: E731  (the position runs on; the slots suffice)
    reset = lambda: decoder.pos.fill_(prompt.shape[1])  # noqa: E731
    out = {}
    run = lambda: (reset(), steps())  # noqa: E731
    eager = time_it(run, dev, warmup=1, repeats=reps).median_s
    out["eager_tokens_per_s"] = n / eager
    if compile_:
        with torch.inference_mode():
            reset()  # compiling calls the step twice (tracing, then the first compiled call): room for both
            mode = "reduce-overhead" if dev.type == "cuda" else None
            compiled, seconds, breaks = compile_step(decoder._step, dev, mode=mode)
            decoder._step = compiled  # step() now runs the compiled step
            t = time_it(run, dev, warmup=1, repeats=reps).median_s
        out.update(compile_seconds=seconds, graph_breaks=breaks, compiled_tokens_per_s=n / t)
    elif dev.type == "cuda":
        try:
            decoder.capture()
            t = time_it(run, dev, warmup=1, repeats=reps).median_s
            out["cuda_graph_tokens_per_s"] = n / t
        except CourseError as err:
            out["cuda_graph_error"] = str(err)
    return out


def compiled_lines(c: dict) -> list[str]:
    if "error" in c:
        return [f"compiled packed int4 step: not run ({c['error']})"]
    lines = [f"compiled packed int4 step (torch.compile, inductor), {c['new_tokens']} tokens, steps alone, in turns "
             f"with the eager packed step:"]
    for wrapper, row in c["by_wrapper"].items():
        lines.append(f"  {wrapper} wrapper: " + (f"not run ({row['error']})" if "error" in row else
                     f"{row['step_tokens_per_s']:.1f} tokens/s against eager's {row['eager_step_tokens_per_s']:.1f} = "
                     f"{row['speedup']:.2f} x; compile {row['cold_s']:.0f} s cold, {row['warm_s']:.0f} s warm; same "
                     f"tokens: {row['same_tokens']}"))
    return lines
