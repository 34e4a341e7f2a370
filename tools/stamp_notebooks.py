"""Stamp every notebook with the Colab badge and set-up cell (tagged `colab-setup`), and strip outputs.

    python tools/stamp_notebooks.py            # rewrite notebooks/*.ipynb in place
    python tools/stamp_notebooks.py --check    # exit 1 if any notebook would change

The repository address comes from pyproject.toml ([project.urls] Repository), the one
place it lives. Run it after editing a notebook (make notebooks does).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from colab import SETUP_MARKER, SETUP_TAG, badge_markdown, setup_cell_source  # noqa: E402


def repository_url() -> str:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["urls"]["Repository"]


def stamp(nb, rel_path: str, repo: str) -> None:
    badge = badge_markdown(repo, rel_path)
    cells = nb.cells
    if cells and cells[0].cell_type == "markdown" and "colab-badge.svg" in cells[0].source.splitlines()[0]:
        rest = cells[0].source.split("\n", 1)
        cells[0].source = badge + ("\n" + rest[1] if len(rest) > 1 else "")
    else:
        cells.insert(0, nbformat.v4.new_markdown_cell(badge))
    setup = setup_cell_source(repo)
    if len(cells) > 1 and cells[1].cell_type == "code" and cells[1].source.startswith(SETUP_MARKER):
        cells[1].source = setup
    else:
        cells.insert(1, nbformat.v4.new_code_cell(setup))
    tags = cells[1].metadata.get("tags", [])
    if SETUP_TAG not in tags:  # the book leaves the cell out by this tag (tools/site/render.py)
        cells[1].metadata["tags"] = [*tags, SETUP_TAG]
    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    repo = repository_url()
    changed = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        before = path.read_text()
        nb = nbformat.reads(before, as_version=4)
        stamp(nb, path.relative_to(ROOT).as_posix(), repo)
        after = nbformat.writes(nb) + "\n"
        if after != before:
            changed.append(path.name)
            if not args.check:
                path.write_text(after)
    verb = "would change" if args.check else "stamped"
    print(f"{verb}: {', '.join(changed) if changed else 'nothing'}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
