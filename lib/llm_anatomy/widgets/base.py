"""What every widget shares: its root CSS class named in its repr, an error line, and a decorator that keeps
callbacks from raising."""

from __future__ import annotations

import functools
import html
import logging

import ipywidgets as W

from ..errors import CourseError

log = logging.getLogger(__name__)


class CourseWidget:
    """Mixed into each course widget (before the ipywidgets class): its root CSS class, and a repr that names it.

    A notebook keeps only a widget's text/plain repr (ipywidgets cuts its long one at 110 characters), so the repr
    says which widget it is: `Stepper(root_class='la-stepper')`. The book (tools/site) reads the class from it to
    show the widget's still, and the browser tests find the widget by it.
    """

    root_class = ""  # "la-<name>"; its parts are "la-<name>-<part>"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.root_class.startswith("la-"):
            raise TypeError(f"{cls.__name__} needs a root_class 'la-<name>'")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root_class={self.root_class!r})"


class ErrorLine(W.HTML):
    """A one-line message area: red for errors, grey for notes, empty when all is well."""

    def __init__(self, css_class: str = "la-error", **kwargs):
        super().__init__(value="", **kwargs)
        self.add_class(css_class)

    def show_error(self, message: str) -> None:
        self.value = f'<span style="color:#b00020">&#9888; {html.escape(message)}</span>'

    def show_note(self, message: str) -> None:
        self.value = f'<span style="color:#555">{html.escape(message)}</span>'

    def clear(self) -> None:
        self.value = ""

    @property
    def text(self) -> str:
        """The message without markup ('' when none), for tests."""
        import re

        return html.unescape(re.sub(r"<[^>]+>", "", self.value)).lstrip("\u26a0 ").strip()


def guarded(method):
    """Wrap a widget callback: a CourseError (or any bug) is shown in `self.error`, never raised.

    The callback should validate first and change state last, so that a refused input changes nothing.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            self.error.clear()
            return method(self, *args, **kwargs)
        except CourseError as err:
            self.error.show_error(str(err))
        except Exception as err:  # a bug: still keep the notebook alive, but say what happened
            log.exception("widget callback failed")
            self.error.show_error(f"Unexpected {type(err).__name__}: {err}")
        return None

    return wrapper
