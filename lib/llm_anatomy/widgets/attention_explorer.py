"""The attention explorer: type a prompt, pick a layer and a head, see who attends to whom.

A thin shell over one pure function and one view: each change runs `model.explore.head_attention` (one forward
pass, the chosen layer's weights kept), draws it with `views.attention` into an Image, and shows errors in the
widget's own error line.

CSS classes: root `la-attention`; parts `la-attention-prompt` (Textarea), `la-attention-show`
(Button), `la-attention-layer` and `la-attention-head` (IntSliders), `la-attention-heatmap`
(Image), `la-attention-caption` (HTML: what is shown), `la-attention-note` (HTML: e.g. the prompt
was cut), `la-attention-error` (the error line).
"""

from __future__ import annotations

import html

import ipywidgets as W

from ..errors import CourseError
from ..model.explore import head_attention
from ..model.scratch import as_scratch
from ..views.attention import MAX_TOKENS, AttentionView, attention_view, heatmap_png
from .base import CourseWidget, ErrorLine, guarded


class AttentionExplorer(CourseWidget, W.VBox):
    """Prompt box, layer and head sliders, and the heatmap of that head's attention weights."""

    root_class = "la-attention"

    def __init__(self, model, tokenizer, prompt: str = "The cat sat on the mat because it was tired.",
                 layer: int = 0, head: int = 0, max_tokens: int = MAX_TOKENS):
        self.model = as_scratch(model)  # shares the weights: no copy
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        cfg = self.model.cfg
        self.prompt_box = W.Textarea(value=prompt, description="Prompt",
                                     layout=W.Layout(width="95%", height="60px"))
        self.prompt_box.add_class("la-attention-prompt")
        self.show_button = W.Button(description="Show", button_style="primary")
        self.show_button.add_class("la-attention-show")
        self.layer_slider = W.IntSlider(value=layer, min=0, max=cfg.num_layers - 1, description="Layer",
                                        continuous_update=False)
        self.layer_slider.add_class("la-attention-layer")
        self.head_slider = W.IntSlider(value=head, min=0, max=cfg.num_heads - 1, description="Head",
                                       continuous_update=False)
        self.head_slider.add_class("la-attention-head")
        self.caption = W.HTML()
        self.caption.add_class("la-attention-caption")
        self.note = W.HTML()
        self.note.add_class("la-attention-note")
        self.error = ErrorLine("la-attention-error")
        self.heatmap = W.Image(format="png")
        self.heatmap.add_class("la-attention-heatmap")
        self.view: AttentionView | None = None
        super().__init__([self.prompt_box, W.HBox([self.show_button, self.layer_slider, self.head_slider]),
                          self.error, self.note, self.caption, self.heatmap])
        self.add_class(self.root_class)
        self.show_button.on_click(lambda _: self.show())
        self.layer_slider.observe(lambda change: self.set_layer(change["new"]), names="value")
        self.head_slider.observe(lambda change: self.set_head(change["new"]), names="value")
        self.show()

    # --- callbacks: plain methods, callable from tests -------------------------------------------

    @guarded
    def show(self) -> AttentionView:
        """Compute and draw the current prompt, layer and head; on a bad input keep the last picture."""
        result = head_attention(self.model, self.tokenizer, self.prompt_box.value, self.layer_slider.value,
                                self.head_slider.value, max_tokens=self.max_tokens)
        view = attention_view(result, self.tokenizer)
        png = heatmap_png(view)
        self.view = view
        self.heatmap.value = png
        self.note.value = f'<span style="color:#8a5a00">{html.escape(view.note)}</span>' if view.note else ""
        self.caption.value = (f"<b>{html.escape(view.title)}</b> &middot; {len(view.tokens)} tokens &middot; "
                              "each row is a query and sums to 1")
        return view

    def set_prompt(self, text: str) -> AttentionView | None:
        """Type `text` into the prompt box and show it (an empty prompt shows an error, keeps the picture)."""
        self.prompt_box.value = text
        return self.show()

    @guarded
    def set_layer(self, layer: int) -> AttentionView | None:
        return self._move(self.layer_slider, layer, "layer")

    @guarded
    def set_head(self, head: int) -> AttentionView | None:
        return self._move(self.head_slider, head, "head")

    def _move(self, slider: W.IntSlider, value: int, what: str) -> AttentionView | None:
        if isinstance(value, bool) or not isinstance(value, int) or not slider.min <= value <= slider.max:
            raise CourseError(f"{what} must be from {slider.min} to {slider.max}, not {value!r}.")
        if slider.value != value:
            slider.value = value  # the slider's observer calls back here with the same value
            return self.view
        return self.show()
