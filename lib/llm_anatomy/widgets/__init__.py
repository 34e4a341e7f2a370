"""Widgets: thin ipywidgets shells over the library's pure functions.

Rules every widget here follows:
- core ipywidgets, matplotlib and plain HTML only (no JavaScript from the internet);
- each callback is a plain method that pytest can call without a browser;
- errors show inside the widget (an error line), never escape to the notebook, and change nothing;
- the root widget carries the CSS class `la-<name>` (its `root_class`, from base.CourseWidget, which its repr
  names), its key parts `la-<name>-<part>`, so the browser tests and the book can find them.
"""

from .base import ErrorLine, guarded

__all__ = ["ErrorLine", "Stepper", "guarded"]


def __getattr__(name: str):
    """`from llm_anatomy.widgets import Stepper` (notebook 12), imported on first use: a widget module loads the
    model's code, which the other widgets do not need."""
    if name == "Stepper":
        from .stepper import Stepper

        return Stepper
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
