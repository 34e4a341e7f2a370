"""Command line: `python -m llm_anatomy {fetch,doctor,bench}`."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import CourseError

# bench topics: name -> "module:function"; each function takes the remaining argv and
# prints its figures (and a JSON object with --json).
BENCHES = {
    "load": "llm_anatomy.models_bench:main",
    "tokenizer": "llm_anatomy.bpe_bench:main",
    "stepper": "llm_anatomy.generation_bench:main",
    "decode": "llm_anatomy.bench:main",
}


def _fetch(args) -> int:
    from .models import fetch_default_model

    folder = fetch_default_model(progress=True)
    print(f"The default model is ready in {folder}")
    return 0


def _doctor(args) -> int:
    from .doctor import environment_report, format_report, problems_in

    report = environment_report()
    print(format_report(report))
    return 1 if problems_in(report) else 0


def _bench(args, rest) -> int:
    target = BENCHES[args.topic]
    module_name, func = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            raise CourseError(f"The '{args.topic}' benchmark is not part of this version of the course yet.") from None
        raise
    return getattr(module, func)(rest) or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_anatomy", description="LLM Anatomy course tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and convert the default model into the cache (run once while online)")
    sub.add_parser("doctor", help="check this machine: versions, device, memory, model cache")
    bench = sub.add_parser("bench", help="print measured figures (add --json for machine-readable output)")
    bench.add_argument("topic", nargs="?", default="decode", choices=sorted(BENCHES))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and (len(argv) == 1 or argv[1] not in BENCHES) and not {"-h", "--help"} & set(argv):
        argv.insert(1, "decode")  # the default topic, so that "bench --model-size 1b" keeps 1b for the option
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "fetch":
            return _fetch(args)
        if args.command == "doctor":
            return _doctor(args)
        return _bench(args, rest)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
