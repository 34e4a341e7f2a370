"""The generation stepper: watch a model write, one token at a time (notebook 05, claim C8).

    from llm_anatomy.widgets.stepper import Stepper
    Stepper(loaded)            # `loaded` from load_model(); shows itself in a notebook
    Stepper(loaded, schema=SCHEMA)   # notebook 12: every token under a JSON schema's grammar (claim C26)

A thin shell over `llm_anatomy.generate.session.GenerationSession` (public methods only) and its view
`llm_anatomy.views.stepper`: Prefill runs the prompt once and
chooses the first token; Step feeds only the newest token and chooses the next; Play steps in a
background thread until Pause, the end-of-turn token or the length limit. Changing temperature,
top-k, top-p, min-p or a penalty draws the current token again from the logits already computed (no model
call).
With a schema (a dict of the course's JSON-schema subset, constrained/schema.py), the session decodes under its
grammar (constrained.GrammarConstraint: the logits of the tokens the automaton's state refuses become -inf, the
state follows the text, EOS only where it accepts), and the chart shows the model's own top candidates with the
ones the grammar removed struck out, beside those it kept, and how many of the vocabulary's tokens it allows. The
schema sits in its own box; an edited schema applies from the next Prefill (one outside the subset is refused
in the error line, and nothing changes).
Everything is plain HTML/CSS in core ipywidgets, updated in place.

CSS classes (for browser tests): root `la-stepper`; parts `la-stepper-prompt`, `-chat`,
`-prefill`, `-step`, `-play`, `-reset`, `-temperature`, `-top-k`, `-top-p`, `-min-p`, `-repetition`,
`-presence`, `-frequency`, `-seed`, `-max-new`,
`-status`, `-text` (tokens are `<span class="la-stepper-token">`, the newest also
`la-stepper-token-new`), `-chart` (rows `la-stepper-bar`, the chosen one also `la-stepper-chosen`; with a
schema also `la-stepper-kept` or `la-stepper-removed`, and the count `la-stepper-allowed`), `-schema` (with a
schema only), `-cache` (the gauge), `-times`, `-attention-on`, `-layer`, `-head`, `-attention`, `-error`.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import ipywidgets as W

from ..constrained.constraint import GrammarConstraint
from ..errors import CourseError
from ..generate.penalties import Penalties
from ..generate.session import GenerationSession
from ..generate.sampling import SamplingParams
from ..model.scratch import as_scratch
from ..views.stepper import attention_html, cache_html, chart_html, grammar_chart_html, text_html, times_html
from .base import CourseWidget, ErrorLine, guarded

class Stepper(CourseWidget, W.VBox):
    """Prefill, Step, Play/Pause, Reset; temperature, top-k, top-p, min-p, penalties; text, candidates, cache, times."""

    root_class = "la-stepper"

    def __init__(self, loaded=None, *, model=None, tokenizer=None, prompt: str | None = None,
                 max_new_tokens: int = 64, temperature: float = 0.7, top_k: int = 50, top_p: float = 0.9,
                 seed: int = 0, min_p: float = 0.0, penalties: Penalties | None = None, schema: dict | None = None):
        if loaded is not None:
            model, tokenizer = as_scratch(loaded), loaded.tokenizer
        if model is None or tokenizer is None:
            raise CourseError("Give the loaded model: Stepper(load_model()).")
        penalties = penalties or Penalties()
        self.session = GenerationSession(model, tokenizer, SamplingParams(
            temperature, top_k, top_p, min_p, penalties.repetition, penalties.presence, penalties.frequency,
            seed=seed, max_tokens=max_new_tokens))
        self._lock = threading.Lock()  # one model call at a time (buttons and the Play thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grammar: tuple[str, GrammarConstraint] | None = None  # the last schema text that compiled, its grammar
        self.schema_box = None
        if schema is not None:  # compiled now: a schema outside the subset is refused before the widget exists
            self.schema_box = W.Textarea(value=json.dumps(schema), placeholder="a JSON schema", continuous_update=False,
                                         layout=W.Layout(width="98%", height="60px"))
            self.session.constraint = self._constraint()
        if prompt is None:
            prompt = "What is the capital of France?" if schema is None else \
                f"Describe Paris as JSON that follows this schema: {json.dumps(schema)}"

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
        self.min_p = W.FloatText(value=min_p, description="min-p", step=0.05, layout=W.Layout(width="170px"))
        self.repetition = W.FloatText(value=penalties.repetition, description="repetition", step=0.1,
                                      layout=W.Layout(width="170px"))
        self.presence = W.FloatText(value=penalties.presence, description="presence", step=0.1,
                                    layout=W.Layout(width="170px"))
        self.frequency = W.FloatText(value=penalties.frequency, description="frequency", step=0.1,
                                     layout=W.Layout(width="170px"))
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
                 "top-k": self.top_k, "top-p": self.top_p, "min-p": self.min_p,
                 "repetition": self.repetition, "presence": self.presence, "frequency": self.frequency, "seed": self.seed, "max-new": self.max_new,
                 "attention-on": self.attention_on, "layer": self.layer, "head": self.head, "status": self.status,
                 "text": self.text, "chart": self.chart, "cache": self.cache, "times": self.times,
                 "attention": self.attention_view}
        if self.schema_box is not None:
            parts["schema"] = self.schema_box
            self.schema_box.observe(lambda _: self.on_schema_change(), names="value")
        for name, widget in parts.items():
            widget.add_class(f"la-stepper-{name}")

        self.prefill_button.on_click(lambda _: self.on_prefill())
        self.step_button.on_click(lambda _: self.on_step())
        self.play_button.on_click(lambda _: self.on_play())
        self.reset_button.on_click(lambda _: self.on_reset())
        for control in (self.temperature, self.top_k, self.top_p, self.min_p, self.repetition, self.presence,
                        self.frequency):
            control.observe(lambda _: self.on_sampling_change(), names="value")
        self.seed.observe(lambda _: self.on_seed_change(), names="value")
        self.max_new.observe(lambda _: self.on_max_new_change(), names="value")
        for control in (self.attention_on, self.layer, self.head):
            control.observe(lambda _: self.on_attention_change(), names="value")

        super().__init__([
            self.prompt, *([self.schema_box] if self.schema_box is not None else []),
            W.HBox([self.chat, self.prefill_button, self.step_button, self.play_button, self.reset_button]),
            W.HBox([self.temperature, self.top_k, self.top_p, self.min_p, self.seed, self.max_new]),
            W.HBox([self.repetition, self.presence, self.frequency]),
            W.HBox([self.attention_on, self.layer, self.head]),
            self.error, self.status, self.text,
            W.HBox([self.chart, W.VBox([self.cache, self.times])]),
            self.attention_view,
        ])
        self.add_class(self.root_class)

    # ---- reading the controls --------------------------------------------------------------
    def _params(self) -> SamplingParams:
        """All the controls as the session's SamplingParams (the stop ids stay the session's); CourseError if a value
        is out of range."""
        penalties = self._penalties()
        return dataclasses.replace(
            self.session.params, temperature=float(self.temperature.value), top_k=self._top_k(),
            top_p=float(self.top_p.value), min_p=float(self.min_p.value), repetition_penalty=penalties.repetition,
            presence_penalty=penalties.presence, frequency_penalty=penalties.frequency, seed=self.seed.value,
            max_tokens=self._max_new())

    def _top_k(self) -> int | None:
        """The top-k control (0 means off: None)."""
        top_k = self.top_k.value
        if top_k < 0:
            raise CourseError(f"top-k must be 0 (off) or a whole number >= 1, not {top_k}.")
        return top_k or None

    def _penalties(self) -> Penalties:
        """The penalty controls as Penalties; CourseError if one is out of range."""
        return Penalties(float(self.repetition.value), float(self.presence.value), float(self.frequency.value))

    def _attention(self):
        if not self.attention_on.value:
            return None
        self.session.check_attention((self.layer.value, self.head.value))
        return (self.layer.value, self.head.value)

    def _constraint(self) -> GrammarConstraint:
        """The schema box's grammar (compiled once per text); CourseError (UnsupportedSchema names the feature) when
        the text is not JSON or not in the course's subset."""
        text = self.schema_box.value
        if self._grammar is None or self._grammar[0] != text:
            try:
                schema = json.loads(text)
            except ValueError as err:
                raise CourseError(f"The schema is not JSON ({err}): write it as a JSON object.") from None
            self._grammar = (text, GrammarConstraint.for_schema(schema, self.session.tokenizer))
        return self._grammar[1]

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
        params, attention = self._params(), self._attention()
        constraint = self._constraint() if self.schema_box is not None else None
        with self._lock:  # the session commits the new options only if the prefill succeeds
            before = self.session.constraint
            self.session.constraint = constraint
            try:
                self.session.prefill(self.prompt.value, chat=self.chat.value, params=params, attention=attention)
            except Exception:
                self.session.constraint = before  # a refused prefill changes nothing, the grammar neither
                raise
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
        self.session.check_can_step()  # refuse before starting a thread
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
        top_k, penalties = self._top_k(), self._penalties()
        with self._lock:  # before prefill: just stores them
            self.session.resample(float(self.temperature.value), top_k, float(self.top_p.value),
                                  float(self.min_p.value), penalties=penalties)
        if self.session.prefilled:
            self._render()

    @guarded
    def on_schema_change(self) -> None:
        self._constraint()
        self.error.show_note("The schema applies from the next Prefill.")

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
        grammar = s.constraint
        self.chart.value = chart_html(last) if grammar is None else grammar_chart_html(last, grammar.vocab_size,
                                                                                       grammar.last)
        self.cache.value = cache_html(last)
        self.times.value = times_html(s.steps)
        if last.attention is not None and s.attention is not None:
            fed = (s.prompt_ids + s.generated)[:last.cache_tokens]
            self.attention_view.value = attention_html(s.tokenizer, fed, last.attention, *s.attention)
        state = {"eos": "finished: the model ended its turn", "length": "finished: length limit"}.get(
            last.stop_reason, "press Step for the next token")
        self.status.value = (f'<span class="la-stepper-count">{len(s.generated)} new token{"" if len(s.generated) == 1 else "s"}</span> · prompt '
                             f'{len(s.prompt_ids)} tokens · prefill {s.prefill_ms:.0f} ms · {state}')
