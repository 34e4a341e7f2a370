"""The generation stepper: watch a model write, one token at a time (notebook 05, claim C8).

    from llm_anatomy.widgets.stepper import Stepper
    Stepper(loaded)            # `loaded` from load_model(); shows itself in a notebook

A thin shell over `llm_anatomy.generation.GenerationSession`: Prefill runs the prompt once and
chooses the first token; Step feeds only the newest token and chooses the next; Play steps in a
background thread until Pause, the end-of-turn token or the length limit. Changing temperature,
top-k or top-p draws the current token again from the logits already computed (no model call).
Everything is plain HTML/CSS in core ipywidgets, updated in place.

CSS classes (for browser tests): root `la-stepper`; parts `la-stepper-prompt`, `-chat`,
`-prefill`, `-step`, `-play`, `-reset`, `-temperature`, `-top-k`, `-top-p`, `-seed`, `-max-new`,
`-status`, `-text` (tokens are `<span class="la-stepper-token">`, the newest also
`la-stepper-token-new`), `-chart` (rows `la-stepper-bar`, the chosen one also `la-stepper-chosen`),
`-cache` (the gauge), `-times`, `-attention-on`, `-layer`, `-head`, `-attention`, `-error`.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as W

from ..errors import CourseError
from ..generation import GenerationSession, StepResult
from ..sampling import SamplingSettings
from .base import ErrorLine, guarded

_MONO = "font-family:ui-monospace,Menlo,Consolas,monospace"


def _show_token(text: str) -> str:
    """Token text made visible in HTML: spaces as a dot-space, newlines as a return sign."""
    shown = text.replace(" ", "\u00b7").replace("\n", "\u21b5")
    return html.escape(shown) or "&#8709;"


def text_html(tokenizer, prompt_ids: list[int], generated: list[int]) -> str:
    """The prompt (grey) and each generated token as a highlighted span; the newest one marked."""
    prompt = html.escape(tokenizer.decode(prompt_ids))
    spans = []
    for i, token in enumerate(generated):
        newest = i == len(generated) - 1
        cls = "la-stepper-token la-stepper-token-new" if newest else "la-stepper-token"
        colour = "#ffd54f" if newest else ("#e3f2fd" if i % 2 == 0 else "#bbdefb")
        piece = html.escape(tokenizer.decode([token]))
        spans.append(f'<span class="{cls}" title="id {token}" style="background:{colour};border-radius:3px;'
                     f'white-space:pre-wrap">{piece}</span>')
    return (f'<div style="{_MONO};font-size:13px;line-height:1.6;white-space:pre-wrap;max-height:260px;'
            f'overflow:auto;border:1px solid #ddd;padding:6px">'
            f'<span style="color:#888">{prompt}</span>{"".join(spans)}</div>')


def chart_html(result: StepResult) -> str:
    """Horizontal bars of the top candidates' probabilities (after the filters), the chosen one marked."""
    rows = []
    for c in result.candidates:
        chosen = c.token_id == result.token_id
        cls = "la-stepper-bar la-stepper-chosen" if chosen else "la-stepper-bar"
        colour = "#e65100" if chosen else "#1976d2"
        mark = "&#9664; chosen" if chosen else ("" if c.prob > 0 else '<span style="color:#999">cut</span>')
        rows.append(f'<tr class="{cls}"><td style="{_MONO};text-align:right;padding-right:6px">'
                    f'{_show_token(c.text)}</td><td style="width:220px"><div style="background:{colour};'
                    f'height:12px;width:{max(c.prob * 100, 0.5):.1f}%"></div></td>'
                    f'<td style="{_MONO};padding-left:6px">{c.prob:6.1%}</td>'
                    f'<td style="color:#999;padding-left:6px">{c.raw_prob:6.1%}</td>'
                    f'<td style="color:#e65100;padding-left:6px">{mark}</td></tr>')
    return (f'<div><b>Next-token candidates</b> (token {result.index + 1}, {result.settings.describe()})'
            f'<table style="border-collapse:collapse;font-size:12px"><tr style="color:#666"><th>token</th>'
            f'<th>probability</th><th>p</th><th>p at T=1</th><th></th></tr>{"".join(rows)}</table></div>')


def cache_html(result: StepResult) -> str:
    """A gauge of the KV cache: positions and bytes filled out of the preallocated room."""
    share = result.cache_tokens / result.cache_capacity_tokens
    return (f'<div><b>KV cache</b>: {result.cache_tokens} of {result.cache_capacity_tokens} positions, '
            f'{result.cache_bytes / 1e6:.2f} MB of {result.cache_capacity_bytes / 1e6:.2f} MB'
            f'<div style="width:320px;height:14px;border:1px solid #888;background:#f4f4f4">'
            f'<div class="la-stepper-cache-fill" style="width:{share * 100:.1f}%;height:100%;'
            f'background:#43a047"></div></div></div>')


def times_html(steps: list[StepResult], last: int = 12) -> str:
    """Prefill time against each decode step's time, as bars on one scale (milliseconds)."""
    prefill, decode = steps[0], steps[1:]
    shown = [("prefill", prefill.ms, prefill.fed_tokens)] + [(f"step {s.index}", s.ms, 1) for s in decode[-last:]]
    scale = max(ms for _, ms, _ in shown) or 1.0
    rows = "".join(
        f'<tr><td style="padding-right:6px">{name}</td><td style="width:220px"><div style="background:'
        f'{"#8e24aa" if name == "prefill" else "#00897b"};height:10px;width:{max(ms / scale * 100, 0.5):.1f}%">'
        f'</div></td><td style="{_MONO};padding-left:6px">{ms:7.1f} ms</td>'
        f'<td style="color:#999;padding-left:6px">{fed} token{"s" if fed > 1 else ""} fed</td></tr>'
        for name, ms, fed in shown)
    summary = ""
    if decode:
        ordered = sorted(s.ms for s in decode)
        summary = f"median decode step {ordered[len(ordered) // 2]:.1f} ms over {len(decode)} steps"
    return (f'<div><b>Time per model call</b><table style="font-size:12px">{rows}</table>'
            f'<div style="color:#555;font-size:12px">{summary}</div></div>')


def attention_html(tokenizer, ids: list[int], weights, layer: int, head: int) -> str:
    """Each earlier token shaded by how much the token fed last attends to it."""
    if weights is None:
        return ""
    top = float(weights.max()) or 1.0
    spans = []
    for token, w in zip(ids, weights.tolist()):
        alpha = w / top
        spans.append(f'<span title="{w:.3f}" style="background:rgba(229,57,53,{alpha:.2f});{_MONO}">'
                     f'{_show_token(tokenizer.decode([token]))}</span>')
    return (f'<div><b>Attention of the token fed last</b> (layer {layer}, head {head}; darker = more weight)'
            f'<div style="font-size:12px;line-height:1.7;max-height:160px;overflow:auto">{"".join(spans)}</div></div>')


class Stepper(W.VBox):
    """Prefill, Step, Play/Pause, Reset; temperature, top-k, top-p; text, candidates, cache, times."""

    def __init__(self, loaded=None, *, model=None, tokenizer=None, prompt: str = "What is the capital of France?",
                 max_new_tokens: int = 64, temperature: float = 0.7, top_k: int = 50, top_p: float = 0.9,
                 seed: int = 0):
        if loaded is not None:
            from ..scratch import ScratchLlama

            model, tokenizer = ScratchLlama.from_hf(loaded.model), loaded.tokenizer
        if model is None or tokenizer is None:
            raise CourseError("Give the loaded model: Stepper(load_model()).")
        self.session = GenerationSession(model, tokenizer, max_new_tokens=max_new_tokens,
                                         settings=SamplingSettings(temperature, top_k, top_p), seed=seed)
        self._lock = threading.Lock()  # one model call at a time (buttons and the Play thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        self.prompt = W.Textarea(value=prompt, placeholder="Type a prompt", layout=W.Layout(width="98%", height="60px"))
        self.chat = W.Checkbox(value=True, description="chat template", indent=False)
        self.prefill_button = W.Button(description="Prefill", button_style="primary", icon="play-circle")
        self.step_button = W.Button(description="Step", icon="step-forward")
        self.play_button = W.Button(description="Play", icon="play")
        self.reset_button = W.Button(description="Reset", icon="undo")
        self.temperature = W.FloatText(value=temperature, description="temperature", step=0.1,
                                       layout=W.Layout(width="170px"))
        self.top_k = W.IntText(value=top_k, description="top-k (0 off)", layout=W.Layout(width="170px"))
        self.top_p = W.FloatText(value=top_p, description="top-p", step=0.05, layout=W.Layout(width="170px"))
        self.seed = W.IntText(value=seed, description="seed", layout=W.Layout(width="150px"))
        self.max_new = W.IntText(value=max_new_tokens, description="max new", layout=W.Layout(width="150px"))
        self.attention_on = W.Checkbox(value=False, description="attention", indent=False,
                                       layout=W.Layout(width="95px"))
        self.layer = W.IntText(value=model.cfg.num_layers - 1, description="layer", layout=W.Layout(width="130px"))
        self.head = W.IntText(value=0, description="head", layout=W.Layout(width="130px"))
        self.status = W.HTML(value="Type a prompt, then press Prefill.")
        self.text = W.HTML()
        self.chart = W.HTML()
        self.cache = W.HTML()
        self.times = W.HTML()
        self.attention_view = W.HTML()
        self.error = ErrorLine("la-stepper-error")

        parts = {"prompt": self.prompt, "chat": self.chat, "prefill": self.prefill_button, "step": self.step_button,
                 "play": self.play_button, "reset": self.reset_button, "temperature": self.temperature,
                 "top-k": self.top_k, "top-p": self.top_p, "seed": self.seed, "max-new": self.max_new,
                 "attention-on": self.attention_on, "layer": self.layer, "head": self.head, "status": self.status,
                 "text": self.text, "chart": self.chart, "cache": self.cache, "times": self.times,
                 "attention": self.attention_view}
        for name, widget in parts.items():
            widget.add_class(f"la-stepper-{name}")

        self.prefill_button.on_click(lambda _: self.on_prefill())
        self.step_button.on_click(lambda _: self.on_step())
        self.play_button.on_click(lambda _: self.on_play())
        self.reset_button.on_click(lambda _: self.on_reset())
        for control in (self.temperature, self.top_k, self.top_p):
            control.observe(lambda _: self.on_sampling_change(), names="value")
        self.seed.observe(lambda _: self.on_seed_change(), names="value")
        self.max_new.observe(lambda _: self.on_max_new_change(), names="value")
        for control in (self.attention_on, self.layer, self.head):
            control.observe(lambda _: self.on_attention_change(), names="value")

        super().__init__([
            self.prompt,
            W.HBox([self.chat, self.prefill_button, self.step_button, self.play_button, self.reset_button]),
            W.HBox([self.temperature, self.top_k, self.top_p, self.seed, self.max_new]),
            W.HBox([self.attention_on, self.layer, self.head]),
            self.error, self.status, self.text,
            W.HBox([self.chart, W.VBox([self.cache, self.times])]),
            self.attention_view,
        ])
        self.add_class("la-stepper")

    # ---- reading the controls --------------------------------------------------------------
    def _settings(self) -> SamplingSettings:
        """The controls as SamplingSettings (top-k 0 means off); CourseError if a value is out of range."""
        top_k = self.top_k.value
        if top_k < 0:
            raise CourseError(f"top-k must be 0 (off) or a whole number >= 1, not {top_k}.")
        return SamplingSettings(float(self.temperature.value), top_k or None, float(self.top_p.value))

    def _attention(self):
        if not self.attention_on.value:
            return None
        self.session._check_attention((self.layer.value, self.head.value))
        return (self.layer.value, self.head.value)

    @property
    def playing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _refuse_while_playing(self) -> None:
        if self.playing:
            raise CourseError("Playing: press Pause first.")

    # ---- callbacks (plain methods, callable from pytest) ----------------------------------
    @guarded
    def on_prefill(self) -> None:
        self._refuse_while_playing()
        settings, attention = self._settings(), self._attention()
        max_new = self._max_new()
        with self._lock:
            trial = GenerationSession(self.session.model, self.session.tokenizer, max_new_tokens=max_new,
                                      settings=settings, seed=self.seed.value, attention=attention)
            trial.prefill(self.prompt.value, chat=self.chat.value)
            self.session = trial  # only a successful prefill replaces the session
        self._render()

    @guarded
    def on_step(self) -> None:
        self._refuse_while_playing()
        self._step_once()

    def _step_once(self) -> None:
        with self._lock:
            self.session.step()
        self._render()

    @guarded
    def on_play(self) -> None:
        """Play when paused, Pause when playing."""
        if self.playing:
            self._stop.set()
            return
        self.session._check_can_step()  # refuse before starting a thread
        self._stop.clear()
        self.play_button.description, self.play_button.icon = "Pause", "pause"
        self._thread = threading.Thread(target=self._play_loop, name="la-stepper-play", daemon=True)
        self._thread.start()

    def _play_loop(self) -> None:
        try:
            while not self._stop.is_set() and not self.session.finished:
                self._guarded_step()
        finally:
            self.play_button.description, self.play_button.icon = "Play", "play"

    @guarded
    def _guarded_step(self) -> None:
        try:
            self._step_once()
        except Exception:
            self._stop.set()  # a refused or failed step ends the loop
            raise

    def pause(self, timeout: float | None = 30.0) -> None:
        """Stop playing and wait for the current step to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @guarded
    def on_reset(self) -> None:
        self.pause()
        with self._lock:
            self.session.reset()
        self.text.value = self.chart.value = self.cache.value = self.times.value = self.attention_view.value = ""
        self.status.value = "Type a prompt, then press Prefill."

    @guarded
    def on_sampling_change(self) -> None:
        """Draw the current token again from the logits already computed (no model call)."""
        settings = self._settings()
        with self._lock:
            self.session.resample(settings.temperature, settings.top_k, settings.top_p)  # before prefill: just stores them
        if self.session.prefilled:
            self._render()

    @guarded
    def on_seed_change(self) -> None:
        self.session.set_seed(self.seed.value)
        self.error.show_note(f"Seed {self.seed.value} applies from the next Prefill.")

    @guarded
    def on_max_new_change(self) -> None:
        self._max_new()
        self.error.show_note(f"At most {self.max_new.value} new tokens from the next Prefill.")

    @guarded
    def on_attention_change(self) -> None:
        attention = self._attention()
        with self._lock:
            self.session.set_attention(attention)
        if attention is None:
            self.attention_view.value = ""
        else:
            self.error.show_note("The attention row shows from the next model call (Prefill or Step).")

    def _max_new(self) -> int:
        value = self.max_new.value
        if value < 1:
            raise CourseError(f"max new tokens must be at least 1, not {value}.")
        return value

    # ---- drawing ----------------------------------------------------------------------------
    def _render(self) -> None:
        s = self.session
        last = s.last
        if last is None:
            return
        self.text.value = text_html(s.tokenizer, s.prompt_ids, s.generated)
        self.chart.value = chart_html(last)
        self.cache.value = cache_html(last)
        self.times.value = times_html(s.steps)
        if last.attention is not None and s.attention is not None:
            fed = (s.prompt_ids + s.generated)[:last.cache_tokens]
            self.attention_view.value = attention_html(s.tokenizer, fed, last.attention, *s.attention)
        state = {"eos": "finished: the model ended its turn", "length": "finished: length limit"}.get(
            last.stop_reason, "press Step for the next token")
        self.status.value = (f'<span class="la-stepper-count">{len(s.generated)} new token{"" if len(s.generated) == 1 else "s"}</span> · prompt '
                             f'{len(s.prompt_ids)} tokens · prefill {s.prefill_ms:.0f} ms · {state}')
