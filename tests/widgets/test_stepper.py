"""The stepper widget's callbacks, called directly (no browser), on the real model."""

from __future__ import annotations

import re

import pytest

from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.widgets.stepper import Stepper


@pytest.fixture(scope="module")
def scratch(real):
    return ScratchLlama.from_hf(real.model)


@pytest.fixture
def stepper(real, scratch):
    return Stepper(model=scratch, tokenizer=real.tokenizer, prompt="What is the capital of France?",
                   max_new_tokens=6, temperature=0.0, top_k=50, top_p=0.9)


@pytest.fixture
def counted(scratch, monkeypatch):
    calls = []
    original = scratch.trace
    monkeypatch.setattr(scratch, "trace", lambda *a, **k: calls.append(a[0].shape[1]) or original(*a, **k))
    return calls


def _tokens(stepper):
    return re.findall(r'class="la-stepper-token[^"]*"', stepper.text.value)


def _snapshot(stepper):
    s = stepper.session
    return (s.prompt_ids[:], s.generated[:], len(s.steps), s.params, s.cache and s.cache.length,
            stepper.text.value, stepper.chart.value, stepper.cache.value, stepper.times.value)


def test_the_widget_carries_its_css_classes(stepper):
    assert "la-stepper" in stepper._dom_classes
    for part, widget in [("prompt", stepper.prompt), ("prefill", stepper.prefill_button),
                         ("step", stepper.step_button), ("play", stepper.play_button), ("reset", stepper.reset_button),
                         ("text", stepper.text), ("chart", stepper.chart), ("cache", stepper.cache),
                         ("times", stepper.times), ("temperature", stepper.temperature), ("top-k", stepper.top_k),
                         ("top-p", stepper.top_p), ("min-p", stepper.min_p), ("repetition", stepper.repetition),
                         ("presence", stepper.presence), ("frequency", stepper.frequency), ("error", stepper.error)]:
        assert f"la-stepper-{part}" in widget._dom_classes


def test_prefill_then_steps_update_text_chart_cache_and_times_in_place(stepper, counted, real):
    children = list(stepper.children)
    stepper.on_prefill()
    assert stepper.error.text == ""
    n_prompt = len(stepper.session.prompt_ids)
    assert counted == [n_prompt]  # the prompt in one call
    assert len(_tokens(stepper)) == 1 and "la-stepper-token-new" in stepper.text.value
    assert stepper.chart.value.count("la-stepper-chosen") == 1
    assert stepper.chart.value.count("la-stepper-bar") == 10 and ">cut<" in stepper.chart.value  # greedy cuts the rest
    assert f"{n_prompt} of {n_prompt + 6} positions" in stepper.cache.value
    assert "prefill" in stepper.times.value
    gauges = []
    for i in range(3):
        stepper.on_step()
        assert stepper.error.text == ""
        assert len(_tokens(stepper)) == i + 2 and stepper.text.value.count("la-stepper-token-new") == 1
        assert f"{n_prompt + i + 1} of {n_prompt + 6} positions" in stepper.cache.value
        gauges.append(re.search(r'la-stepper-cache-fill" style="width:([\d.]+)%', stepper.cache.value).group(1))
        assert f"step {i + 1}" in stepper.times.value
    assert counted == [n_prompt, 1, 1, 1]  # then only the newest token each step
    assert [float(g) for g in gauges] == sorted(float(g) for g in gauges) and len(set(gauges)) == 3
    assert real.tokenizer.decode(stepper.session.generated) == "The capital of France"  # greedy
    assert "median decode step" in stepper.times.value
    assert list(stepper.children) == children  # the same widget, updated in place


def test_changing_the_controls_resamples_without_a_model_call(stepper, counted):
    stepper.on_prefill()
    stepper.on_step()
    calls = len(counted)
    chosen_before = stepper.session.generated[-1]
    stepper.top_k.value = 1  # fires the observer
    assert stepper.error.text == "" and len(counted) == calls
    assert stepper.session.generated[-1] == chosen_before  # greedy and top-1 agree
    stepper.temperature.value = 3.0
    stepper.top_k.value = 0  # off
    stepper.top_p.value = 1.0
    seen = {stepper.session.generated[-1]}
    for _ in range(10):
        stepper.on_sampling_change()
        seen.add(stepper.session.generated[-1])
    assert len(counted) == calls, "re-sampling must not run the model"
    assert len(seen) > 1 and len(stepper.session.generated) == 2
    assert "temperature 3" in stepper.chart.value and stepper.chart.value.count("la-stepper-chosen") == 1


def test_min_p_and_penalty_controls_resample_without_a_model_call(real, scratch, counted):
    stepper = Stepper(model=scratch, tokenizer=real.tokenizer, prompt="the the the the", max_new_tokens=4,
                      temperature=0.0)
    stepper.chat.value = False
    stepper.on_prefill()
    calls, greedy = len(counted), stepper.session.generated[-1]
    stepper.repetition.value = 1e6  # every token of the prompt pushed far down
    assert stepper.error.text == "" and stepper.session.params.repetition_penalty == 1e6
    assert stepper.session.generated[-1] not in stepper.session.prompt_ids
    stepper.repetition.value = 1.0
    assert stepper.session.generated[-1] == greedy
    stepper.temperature.value = 2.0
    stepper.min_p.value = 1.0  # only the most likely token passes
    assert stepper.session.generated[-1] == greedy and stepper.session.params.min_p == 1.0
    assert "min-p 1" in stepper.chart.value and len(counted) == calls
    stepper.presence.value = 0.5  # counts the output only: nothing generated before this token
    assert stepper.session.params.presence_penalty == 0.5 and stepper.session.generated[-1] == greedy
    stepper.on_step()  # the penalties stay for the next step
    assert len(counted) == calls + 1 and stepper.session.params.presence_penalty == 0.5


def test_play_runs_to_the_limit_and_stops(stepper):
    stepper.on_prefill()
    stepper.on_play()
    assert stepper.play_button.description in ("Pause", "Play")
    stepper._thread.join(120)
    assert not stepper.playing and stepper.play_button.description == "Play"
    assert stepper.session.finished and len(stepper.session.generated) <= 6
    assert stepper.error.text == ""
    stepper.on_play()  # after the end: refused, not started
    assert "finished" in stepper.error.text and not stepper.playing


def test_pause_stops_the_loop_cleanly(real, scratch):
    stepper = Stepper(model=scratch, tokenizer=real.tokenizer, prompt="Count from one to fifty.",
                      max_new_tokens=200, temperature=0.0)
    stepper.on_prefill()
    stepper.on_play()
    stepper.on_step()  # refused while playing
    assert "Pause" in stepper.error.text
    stepper.on_play()  # pause
    stepper._thread.join(60)
    assert not stepper.playing and not stepper.session.finished
    n = len(stepper.session.generated)
    stepper.on_step()
    assert len(stepper.session.generated) == n + 1 and stepper.error.text == ""


@pytest.mark.parametrize("action, message", [
    ("step_before_prefill", "prefill"), ("empty_prompt", "empty"), ("long_prompt", "at most"),
    ("temperature", "temperature"), ("top_p", "top_p"), ("top_p_zero", "top_p"), ("top_k", "top-k"),
    ("max_new", "max new"), ("layer", "layer"), ("min_p", "min_p"), ("repetition", "repetition_penalty"),
    ("presence", "presence_penalty"),
])
def test_bad_input_shows_a_message_and_changes_nothing(stepper, action, message):
    stepper.on_prefill()
    stepper.on_step()
    before = _snapshot(stepper)
    if action == "step_before_prefill":
        stepper.on_reset()
        before = _snapshot(stepper)
        stepper.on_step()
    elif action == "empty_prompt":
        stepper.prompt.value = "  "
        stepper.on_prefill()
    elif action == "long_prompt":
        stepper.prompt.value = "word " * 9000
        stepper.on_prefill()
    elif action == "temperature":
        stepper.temperature.value = -1.0
    elif action == "top_p":
        stepper.top_p.value = 1.5
    elif action == "top_p_zero":
        stepper.top_p.value = 0.0
    elif action == "top_k":
        stepper.top_k.value = -2
    elif action == "min_p":
        stepper.min_p.value = 1.5
    elif action == "repetition":
        stepper.repetition.value = 0.0
    elif action == "presence":
        stepper.presence.value = 2.5
    elif action == "max_new":
        stepper.max_new.value = 0
        stepper.on_prefill()
    elif action == "layer":
        stepper.attention_on.value = True
        stepper.layer.value = 99
    assert message in stepper.error.text.lower() or message in stepper.error.text, stepper.error.text
    assert _snapshot(stepper) == before


def test_stepping_after_the_end_is_refused(stepper):
    stepper.on_prefill()
    while not stepper.session.finished:
        stepper.on_step()
    before = _snapshot(stepper)
    stepper.on_step()
    assert "finished" in stepper.error.text and _snapshot(stepper) == before
    assert "finished" in stepper.status.value


def test_attention_row_is_drawn_on_request(stepper):
    stepper.attention_on.value = True
    stepper.layer.value, stepper.head.value = 2, 1
    stepper.on_prefill()
    stepper.on_step()
    n = stepper.session.last.cache_tokens
    assert "layer 2, head 1" in stepper.attention_view.value
    assert stepper.attention_view.value.count("<span title=") == n
