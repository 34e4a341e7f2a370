"""The serving stepper: submit requests, step the continuous-batching scheduler, watch the KV blocks (notebook 08).

    from llm_anatomy.widgets.scheduler import SchedulerWidget
    SchedulerWidget(model, shared_prefix=system_prompt_ids)   # a ScratchLlama; shows itself in a notebook

A thin shell over `llm_anatomy.serve.scheduler.ContinuousScheduler` (submit, step) and its view
`llm_anatomy.views.serving.scheduler_html`. Submit queues a request of the chosen prompt and output lengths (with
the shared system prompt in front when ticked, so its full blocks come from the prefix cache); Step runs one
iteration of the real model; Run to end steps until every request is done; Reset empties the pool. A refused
request (a length of 0, or longer than the whole pool) is named in the error line and changes nothing.

CSS classes (for browser tests): root `la-serving`; parts `la-serving-prompt` and `la-serving-output` (IntText,
tokens), `la-serving-shared` (Checkbox), `la-serving-submit`, `la-serving-step`, `la-serving-run`,
`la-serving-reset` (buttons), `la-serving-view` (HTML: blocks `la-serving-block` with `la-serving-used`, `-shared`,
`-cached` or `-free`; the line `la-serving-summary`; requests `la-serving-request` with `la-serving-waiting`,
`-prefilling`, `-decoding` or `-finished`), `la-serving-error` (the error line).
"""

from __future__ import annotations

import ipywidgets as W
import numpy as np

from ..serve.batching import Request
from ..errors import CourseError
from ..serve.paged_kv import PagedKVPool
from ..serve.scheduler import ContinuousScheduler
from ..views.serving import scheduler_html
from .base import CourseWidget, ErrorLine, guarded


class SchedulerWidget(CourseWidget, W.VBox):
    """Prompt and output lengths, shared prefix; Submit, Step, Run to end, Reset; the pool and the requests."""

    root_class = "la-serving"

    def __init__(self, model, *, num_blocks: int = 32, block_size: int = 8, max_batch: int = 4,
                 max_batched_tokens: int | None = 64, shared_prefix=None, tokens=None, seed: int = 0,
                 prompt_tokens: int = 12, output_tokens: int = 6):
        self.model, self.settings = model, dict(num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                                                max_batched_tokens=max_batched_tokens)
        self._rng = np.random.default_rng(seed)
        vocab = model.cfg.vocab_size
        self.tokens = list(tokens) if tokens is not None else self._rng.integers(3, vocab, 4096).tolist()
        self.shared_prefix = list(shared_prefix) if shared_prefix is not None else self.tokens[:2 * block_size]
        self.prompt_box = W.IntText(value=prompt_tokens, description="prompt", layout=W.Layout(width="160px"))
        self.output_box = W.IntText(value=output_tokens, description="output", layout=W.Layout(width="160px"))
        self.shared_box = W.Checkbox(value=True, indent=False,
                                     description=f"after the shared prefix ({len(self.shared_prefix)} tokens)")
        self.submit_button = W.Button(description="Submit", button_style="primary", icon="plus")
        self.step_button = W.Button(description="Step", icon="step-forward")
        self.run_button = W.Button(description="Run to end", icon="fast-forward")
        self.reset_button = W.Button(description="Reset", icon="undo")
        self.view = W.HTML()
        self.error = ErrorLine("la-serving-error")
        parts = {"prompt": self.prompt_box, "output": self.output_box, "shared": self.shared_box,
                 "submit": self.submit_button, "step": self.step_button, "run": self.run_button,
                 "reset": self.reset_button, "view": self.view}
        for name, widget in parts.items():
            widget.add_class(f"la-serving-{name}")
        super().__init__([W.HBox([self.prompt_box, self.output_box, self.shared_box]),
                          W.HBox([self.submit_button, self.step_button, self.run_button, self.reset_button]),
                          self.error, self.view])
        self.add_class(self.root_class)
        self.submit_button.on_click(lambda _: self.submit())
        self.step_button.on_click(lambda _: self.step())
        self.run_button.on_click(lambda _: self.run_to_end())
        self.reset_button.on_click(lambda _: self.reset())
        self.scheduler: ContinuousScheduler | None = None
        self._new_scheduler()

    def _new_scheduler(self) -> None:
        s = self.settings
        pool = PagedKVPool.for_model(self.model, s["num_blocks"], s["block_size"])
        self.scheduler = ContinuousScheduler(self.model, pool, s["max_batch"], s["max_batched_tokens"],
                                             prefix_cache=True)
        self._start = 0  # where the next fresh prompt is read from self.tokens
        self.refresh()

    # --- callbacks: plain methods, callable from tests -------------------------------------------

    @guarded
    def submit(self, prompt_tokens: int | None = None, output_tokens: int | None = None,
               shared: bool | None = None) -> Request:
        """Queue a request of `prompt_tokens` fresh tokens (after the shared prefix when `shared`) and
        `output_tokens` new ones; the boxes' values when not given. Returns it, or None when refused."""
        n = self.prompt_box.value if prompt_tokens is None else prompt_tokens
        out = self.output_box.value if output_tokens is None else output_tokens
        shared = self.shared_box.value if shared is None else shared
        if isinstance(n, bool) or not isinstance(n, int) or n < (0 if shared else 1):
            raise CourseError(f"The prompt needs at least {'0' if shared else '1'} fresh tokens, not {n!r}.")
        if n > len(self.tokens):
            raise CourseError(f"At most {len(self.tokens)} fresh prompt tokens, not {n}.")
        start = self._start if self._start + n <= len(self.tokens) else 0
        prompt = (self.shared_prefix if shared else []) + self.tokens[start:start + n]
        request = self.scheduler.submit(Request(prompt, out, arrival_s=self.scheduler.stats().now_s))  # checks all
        self._start = start + n
        self.refresh()
        return request

    @guarded
    def step(self) -> None:
        """One iteration of the scheduler (a note when there is nothing to do)."""
        if not self.scheduler.has_unfinished():
            self.error.show_note("Nothing to do: submit a request first.")
        else:
            self.scheduler.step()
        self.refresh()

    @guarded
    def run_to_end(self, max_steps: int = 500) -> None:
        """Step until every submitted request is done (at most max_steps iterations)."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished():
                break
            self.scheduler.step()
        self.refresh()

    @guarded
    def reset(self) -> None:
        """A fresh scheduler with an empty pool and no requests."""
        self._new_scheduler()

    def refresh(self) -> None:
        self.view.value = scheduler_html(self.scheduler)

    @property
    def view_text(self) -> str:
        """The view without markup, for tests."""
        import html
        import re

        return html.unescape(re.sub(r"<[^>]+>", " ", self.view.value))
