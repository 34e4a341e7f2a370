"""The KV memory calculator: pick a model, a length, a number of users and a GPU; see the cache's size.

A thin shell over `llm_anatomy.measure.kv_memory.kv_report` and its view `llm_anatomy.views.kv_memory`. Every change recomputes the result in place;
a refused value (zero, negative, too large) is named in the error line and the last good result stays.

CSS classes: root `la-kvcalc`; parts `la-kvcalc-model` (Dropdown), `la-kvcalc-length` (IntText, tokens),
`la-kvcalc-users` (IntText), `la-kvcalc-dtype` (Dropdown), `la-kvcalc-memory` (FloatText, GiB),
`la-kvcalc-result` (HTML), `la-kvcalc-error` (the error line).
"""

from __future__ import annotations

import html

import ipywidgets as W

from ..measure.kv_memory import DTYPES, FAMOUS_MODELS, KVReport, kv_report
from ..views.kv_memory import report_html
from .base import CourseWidget, ErrorLine, guarded


class KVCalculator(CourseWidget, W.VBox):
    """Model, length, users, number format and GPU memory in; cache size and users that fit out."""

    root_class = "la-kvcalc"

    def __init__(self, model: str = "Llama-3-8B", length: int = 8192, users: int = 8, dtype: str = "bf16",
                 gpu_memory_gib: float = 80.0):
        self.model_box = W.Dropdown(options=list(FAMOUS_MODELS), value=model, description="Model")
        self.model_box.add_class("la-kvcalc-model")
        self.length_box = W.IntText(value=length, description="Length")
        self.length_box.add_class("la-kvcalc-length")
        self.users_box = W.IntText(value=users, description="Users")
        self.users_box.add_class("la-kvcalc-users")
        self.dtype_box = W.Dropdown(options=list(DTYPES), value=dtype, description="Format")
        self.dtype_box.add_class("la-kvcalc-dtype")
        self.memory_box = W.FloatText(value=gpu_memory_gib, description="GPU GiB")
        self.memory_box.add_class("la-kvcalc-memory")
        self.result = W.HTML()
        self.result.add_class("la-kvcalc-result")
        self.error = ErrorLine("la-kvcalc-error")
        self.state = dict(model=model, length=length, users=users, dtype=dtype, gpu_memory_gib=gpu_memory_gib)
        self.report: KVReport | None = None
        super().__init__([W.HBox([self.model_box, self.dtype_box]), W.HBox([self.length_box, self.users_box]),
                          self.memory_box, self.error, self.result])
        self.add_class(self.root_class)
        self.model_box.observe(lambda c: self.set_model(c["new"]), names="value")
        self.length_box.observe(lambda c: self.set_length(c["new"]), names="value")
        self.users_box.observe(lambda c: self.set_users(c["new"]), names="value")
        self.dtype_box.observe(lambda c: self.set_dtype(c["new"]), names="value")
        self.memory_box.observe(lambda c: self.set_gpu_memory(c["new"]), names="value")
        self._apply({})

    # --- callbacks: plain methods, callable from tests -------------------------------------------

    @guarded
    def set_model(self, name: str) -> None:
        self._apply({"model": name})

    @guarded
    def set_length(self, tokens: int) -> None:
        self._apply({"length": tokens})

    @guarded
    def set_users(self, users: int) -> None:
        self._apply({"users": users})

    @guarded
    def set_dtype(self, dtype: str) -> None:
        self._apply({"dtype": dtype})

    @guarded
    def set_gpu_memory(self, gib: float) -> None:
        self._apply({"gpu_memory_gib": gib})

    def _apply(self, change: dict) -> None:
        """Compute with the change first (raises CourseError if refused), then commit state and display."""
        wanted = {**self.state, **change}
        report = kv_report(**wanted)  # validates everything before any state changes
        self.state, self.report = wanted, report
        self.result.value = report_html(report)

    @property
    def result_text(self) -> str:
        """The result without markup, for tests."""
        import re

        return html.unescape(re.sub(r"<[^>]+>", " ", self.result.value))
