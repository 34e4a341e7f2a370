"""llama.cpp beside our decode: its `llama-bench` run on the course's own Q4_1 file, decode only, same threads.

No llama.cpp ships with the course: tools/build_llama_bench.sh builds `llama-bench` from the llama-cpp-python
source package (cmake and g++, about 15 minutes on 2 cores), and `bench fast --llama-bench PATH` (or the environment
variable LLAMA_BENCH) names it. Its decode figure is its eval rate (`-p 0 -n N`: generated tokens over the decode
steps alone), the same measure as our "steps alone", so the ratio compares like with like.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ..errors import CourseError

HOW = ("no llama-bench given: build one with tools/build_llama_bench.sh (cmake and g++, about 15 minutes on 2 cores), "
       "then pass --llama-bench PATH or set LLAMA_BENCH=PATH")


def find_llama_bench(path: str | os.PathLike | None = None) -> Path | None:
    """The binary named by `path`, else by the environment variable LLAMA_BENCH; None when neither names one.
    A name that is not an executable file is an error (one sentence), not a silent absence."""
    name = path if path else os.environ.get("LLAMA_BENCH")
    if not name:
        return None
    binary = Path(name).expanduser()
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise CourseError(f"llama-bench {str(binary)!r} is not an executable file; build one with "
                          f"tools/build_llama_bench.sh.")
    return binary


def run_llama_bench(binary: Path, model_file: Path, threads: int, new_tokens: int = 64, repetitions: int = 5,
                    timeout_s: float = 600) -> dict:
    """llama-bench's decode of `model_file` on `threads` threads, CPU only: {tokens_per_s, stddev, samples, ...}.
    A binary that fails, runs past `timeout_s` or prints no decode row in JSON is a CourseError of one sentence."""
    command = [str(binary), "-m", str(model_file), "-p", "0", "-n", str(new_tokens), "-t", str(threads),
               "-r", str(repetitions), "-ngl", "0", "-o", "json"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CourseError(f"llama-bench could not run ({type(err).__name__}: {err}).") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        raise CourseError(f"llama-bench exited with status {done.returncode} ({last}).")
    try:
        rows = json.loads(done.stdout)
        row = next(r for r in rows if r.get("n_prompt") == 0 and r.get("n_gen", 0) > 0)
        speed = float(row["avg_ts"])
    except (ValueError, TypeError, KeyError, StopIteration, AttributeError):
        raise CourseError("llama-bench printed no decode row in JSON (expected a list of objects with n_prompt 0, "
                          "n_gen and avg_ts).") from None
    if not speed > 0:
        raise CourseError(f"llama-bench reported {speed} tokens/s, not a positive speed.")
    return {"tokens_per_s": speed, "stddev_tokens_per_s": float(row.get("stddev_ts", 0.0)),
            "samples_tokens_per_s": [float(s) for s in row.get("samples_ts", [])], "new_tokens": row["n_gen"],
            "threads": row.get("n_threads", threads), "build_commit": row.get("build_commit"),
            "command": " ".join(command)}


def llama_cpp_row(path, model_file: Path, threads: int, ours_tokens_per_s: float, new_tokens: int = 64) -> dict:
    """What bench fast reports about llama.cpp: its figure and our fastest decode's ratio to it, or, without a
    binary or with a bad one, no figure and the sentence that says why (the bench's other figures stand)."""
    try:
        binary = find_llama_bench(path)
        if binary is None:
            return {"tokens_per_s": None, "note": HOW}
        row = run_llama_bench(binary, model_file, threads, new_tokens)
    except CourseError as err:
        return {"tokens_per_s": None, "note": str(err)}
    return {**row, "binary": str(binary), "model_file": str(model_file),
            "ours_tokens_per_s": ours_tokens_per_s, "ratio": ours_tokens_per_s / row["tokens_per_s"]}


def llama_cpp_line(row: dict) -> str:
    """llama_cpp_row as one line of a table: the figure and the ratio, or why there is none."""
    if row["tokens_per_s"] is None:
        return f"llama.cpp: not measured ({row['note']})"
    return (f"llama.cpp (llama-bench, decode alone, {row['threads']} threads): {row['tokens_per_s']:.1f} tokens/s; "
            f"ours (steps alone) {row['ours_tokens_per_s']:.1f} = {row['ratio']:.2f} x")


def course_gguf(model_size: str) -> Path:
    """The course's Q4_1 file, what llama.cpp decodes: verified (fetched if need be) for the default model; for a
    random test model, where it would sit in the cache (llama.cpp's figure is then of another model than ours)."""
    from ..weights.cache import GGUF_NAME, cache_dir, ensure_gguf

    return ensure_gguf(progress=False) if model_size == "default" else cache_dir() / "gguf" / GGUF_NAME
