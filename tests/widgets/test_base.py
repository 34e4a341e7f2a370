"""What every course widget shares (widgets/base.py): a root CSS class that its repr names, errors shown inside it."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import ipywidgets as W
import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.widgets.base import CourseWidget, ErrorLine, guarded

WIDGETS = Path(__file__).resolve().parents[2] / "lib" / "llm_anatomy" / "widgets"


def _course_widgets():
    found = []
    for path in sorted(WIDGETS.glob("*.py")):
        module = importlib.import_module(f"llm_anatomy.widgets.{path.stem}")
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, W.DOMWidget) and cls.__module__ == module.__name__ and cls is not ErrorLine]
    return found


def test_every_widget_names_its_own_root_class():
    widgets = _course_widgets()
    assert len(widgets) >= 5
    for cls in widgets:
        assert issubclass(cls, CourseWidget), f"{cls.__name__} is not a CourseWidget: the book cannot name it"
        assert cls.root_class.startswith("la-") and cls.__repr__ is CourseWidget.__repr__, cls.__name__
    roots = [cls.root_class for cls in widgets]
    assert len(set(roots)) == len(roots), f"two widgets share a root class: {roots}"


def test_the_repr_names_the_class_and_the_root_class_the_browser_finds():
    from llm_anatomy.widgets.kv_calculator import KVCalculator

    widget = KVCalculator()
    assert repr(widget) == "KVCalculator(root_class='la-kvcalc')"
    assert widget._repr_mimebundle_()["text/plain"] == repr(widget)  # what a notebook keeps
    assert "la-kvcalc" in widget._dom_classes


def test_a_widget_without_a_root_class_is_refused_when_defined():
    with pytest.raises(TypeError, match="root_class"):
        type("Nameless", (CourseWidget, W.VBox), {})


def test_a_guarded_callback_shows_the_error_and_returns_none():
    class Box:
        error = ErrorLine()

        @guarded
        def bad(self):
            raise CourseError("Give a whole number.")

    box = Box()
    assert box.bad() is None and box.error.text == "Give a whole number."
