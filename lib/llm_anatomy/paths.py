"""Where the course's files are: the data/ folder of the repository."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CourseError


def repo_root() -> Path:
    """The repository root (lib/llm_anatomy/../..), where data/ and notebooks/ live."""
    return Path(__file__).resolve().parents[2]


def data_path(name: str = "") -> Path:
    """A file in data/ ($LLM_ANATOMY_DATA overrides the folder)."""
    folder = Path(os.environ.get("LLM_ANATOMY_DATA") or repo_root() / "data")
    path = folder / name
    if not path.exists():
        raise CourseError(f"{path} is missing: run the course from a clone of its repository "
                          "(pip install -e . from the clone), or set LLM_ANATOMY_DATA to its data/ folder.")
    return path
