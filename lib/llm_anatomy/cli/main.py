"""`python -m llm_anatomy {fetch,doctor,check,bench,parallel,serve}`: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import sys

from ..errors import CourseError
from . import check, doctor, serve
from .bench import api, decode, fast, load, parallel, serving, stepper, structured, tokenizer

# bench topics: each module's main(argv) prints its figures (one JSON object with --json)
BENCHES = {"decode": decode.main, "load": load.main, "stepper": stepper.main, "tokenizer": tokenizer.main,
           "serving": serving.main, "fast": fast.main, "parallel": parallel.main, "api": api.main,
           "structured": structured.main}


def fetch(argv: list[str]) -> int:
    from ..weights.cache import fetch_default_model

    argparse.ArgumentParser(prog="python -m llm_anatomy fetch").parse_args(argv)
    folder = fetch_default_model(progress=True)
    print(f"The default model is ready in {folder}")
    return 0


COMMANDS = {"fetch": (fetch, "download and convert the default model into the cache (run once while online)"),
            "doctor": (doctor.main, "check this machine: versions, device, memory, model cache"),
            "check": (check.main, "how exactly the from-scratch model matches transformers (full, cached, padded)"),
            "bench": (None, "print measured figures; topics: " + ", ".join(BENCHES) + " (add --json)"),
            "parallel": (parallel.main, "tensor (--tp 3) and pipeline (--pp 2) parallelism on this machine: checks, "
                                        "the all-reduce's cost, a TP step predicted and measured"),
            "serve": (serve.main, "an OpenAI-compatible server on the course's scheduler, on 127.0.0.1:8000 (notebook "
                                  "11)")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m llm_anatomy", description="LLM Anatomy course tools.")
    parser.add_argument("command", choices=list(COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in COMMANDS.items()))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args, rest = parser.parse_known_args(argv[:1])
    rest = argv[1:]
    try:
        if args.command != "bench":
            return COMMANDS[args.command][0](rest) or 0
        topic = "decode"  # the default topic, so that "bench --model-size 1b" keeps 1b for the option
        if rest and not rest[0].startswith("-"):
            topic, rest = rest[0], rest[1:]
            if topic not in BENCHES:
                parser.error(f"unknown bench topic {topic!r}: choose one of {', '.join(BENCHES)}")
        return BENCHES[topic](rest) or 0
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
