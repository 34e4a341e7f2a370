"""`python -m llm_anatomy bench TOPIC`: each topic is a module here with a `main(argv) -> int`.

The model benchmarks (decode, serving, fast) share their options and their output: `parser` makes the common
options, `set_threads` applies --threads, and `report` prints one JSON object (--json) or a table, with progress on
stderr while a table is coming.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ...errors import CourseError


def parser(topic: str, doc: str, model_sizes: list[str], model_help: str) -> argparse.ArgumentParser:
    """An argument parser with the options every model benchmark takes: --json, --quick, --device, --model-size,
    --threads."""
    p = argparse.ArgumentParser(prog=f"python -m llm_anatomy bench {topic}", description=doc.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--quick", action="store_true", help="small sizes, for CI (seconds)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda or mps")
    p.add_argument("--model-size", default="default", choices=model_sizes, help=model_help)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: one per core free now, re-measured before each timing)")
    return p


def set_threads(threads: int | None, device: str = "auto") -> None:
    """Apply --threads: torch's CPU threads by hand, at least 1; None applies the course's thread policy on a CPU (one
    per core free now, re-measured before each timed comparison: device.use_cpu_threads)."""
    from ...device import pick_device, pin_cpu_threads, use_cpu_threads

    if threads is None:
        use_cpu_threads(pick_device(device))
    elif threads < 1:
        raise CourseError(f"--threads must be at least 1, not {threads}.")
    else:
        pin_cpu_threads(threads)


def load_bench_model(model_size: str, device, dtype, vocab_size: int | None = None):
    """The model a benchmark measures, as (hf, scratch, tokenizer): the course's default model from the offline
    cache ("default", with its tokenizer) or a seeded random one of a named shape (weights.random; tokenizer None),
    on `device` in `dtype`, and the course's ScratchLlama over the same weights. The benchmarks' one loader.
    vocab_size: a random shape's vocabulary instead of its own (a tokenizer's, for a benchmark that decodes text)."""
    from ...model.scratch import ScratchLlama

    if model_size == "default":
        from ...weights.load import load_model

        loaded = load_model(device=device, dtype=dtype, verbose=False)
        hf, tokenizer = loaded.model, loaded.tokenizer
    else:
        from ...weights.random import random_llama

        changes = {} if vocab_size is None else {"vocab_size": vocab_size}
        hf, tokenizer = random_llama(model_size, device, dtype, **changes), None
    return hf, ScratchLlama.from_hf(hf), tokenizer


def progress(as_json: bool):
    """Where a benchmark says what it is doing: stderr for a table, nowhere for --json (stdout stays one object)."""
    return (lambda message: None) if as_json else (lambda message: print(message, file=sys.stderr))


def _strict(value):
    """The value with every NaN (a spread of one repeat: nothing to compare) as None, so the JSON is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def report(result: dict, as_json: bool, format_table) -> int:
    """Print the result as one JSON object or as the benchmark's table; the exit status is 0."""
    print(json.dumps(_strict(result), indent=2) if as_json else format_table(result))
    return 0
