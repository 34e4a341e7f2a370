"""python -m tools.site build | readme-images  (run from the repository root; `make site`, `make screenshots`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from tools.site import build

    parser = argparse.ArgumentParser(prog="python -m tools.site", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="render build/executed/ into the HTML book in build/site/ (executes nothing)")
    b.add_argument("--executed", type=Path, default=build.EXECUTED, help="executed notebooks (default: %(default)s)")
    b.add_argument("--screenshots", type=Path, default=build.SCREENSHOTS, help="widget stills (default: %(default)s)")
    b.add_argument("--out", type=Path, default=build.OUT, help="where the book goes (default: %(default)s)")
    b.add_argument("--strict", action="store_true", help="a missing widget still stops the build")
    b.add_argument("--after-failed-run", action="store_true",
                   help="the run that executed the notebooks failed and named its failures: point to them, do not "
                        "repeat them (make site)")
    r = sub.add_parser("readme-images", help="the README's pictures, from the browser tests' screenshots and the "
                                             "executed notebook 07")
    r.add_argument("--executed", type=Path, default=build.EXECUTED)
    r.add_argument("--screenshots", type=Path, default=build.SCREENSHOTS)
    args = parser.parse_args(argv)

    if args.command == "build":
        try:
            book = build.build_book(executed=args.executed, screenshots=args.screenshots, out=args.out,
                                    strict=args.strict)
        except build.BuildError as err:
            failed = build.failed_notebooks(args.executed) if args.after_failed_run else []
            print(f"make site: the book was not built: a cell failed in {', '.join(failed)} (named above, once)"
                  if failed else f"make site: {err}", file=sys.stderr)
            return 1
        print(book.summary())
        return 0
    from tools.site import readme_images

    try:
        for path in readme_images.make_all(executed=args.executed, screenshots=args.screenshots):
            print(f"wrote {path.relative_to(build.ROOT)} ({path.stat().st_size / 1e3:.0f} KB)")
    except build.BuildError as err:
        print(f"make screenshots: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
