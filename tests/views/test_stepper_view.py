"""The stepper's view (views/stepper.py): HTML drawn from StepResults alone, no model needed."""

from __future__ import annotations

import re

import torch

from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.generate.steps import Candidate, StepResult
from llm_anatomy.views.stepper import attention_html, cache_html, chart_html, grammar_chart_html, text_html, times_html


class CharTokenizer:
    """One token per character: id = code point."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _step(index, token, ms, fed=1, candidates=None, tokens=10, capacity=40):
    candidates = candidates or [Candidate(token, chr(token), 0.7, 0.6), Candidate(66, "B", 0.3, 0.3),
                                Candidate(67, "C", 0.0, 0.1)]
    prob = next(c.prob for c in candidates if c.token_id == token)
    return StepResult(index, token, chr(token), prob, candidates, fed, tokens, tokens * 100, capacity, capacity * 100,
                      ms, SamplingParams(temperature=0.7, top_k=2))


def test_the_text_shows_the_prompt_and_marks_the_newest_token():
    html = text_html(CharTokenizer(), [ord(c) for c in "a<b"], [ord("x"), ord("y"), ord("z")])
    assert "a&lt;b" in html  # the prompt, escaped
    assert re.findall(r'class="la-stepper-token[^"]*"', html) == ['class="la-stepper-token"'] * 2 + [
        'class="la-stepper-token la-stepper-token-new"']
    assert html.index(">x<") < html.index(">y<") < html.index(">z<")


def test_the_chart_marks_the_chosen_token_and_what_the_filters_cut():
    html = chart_html(_step(3, ord("A"), 2.0))
    rows = re.findall(r'<tr class="(la-stepper-bar[^"]*)">(.*?)</tr>', html)
    assert [cls for cls, _ in rows] == ["la-stepper-bar la-stepper-chosen", "la-stepper-bar", "la-stepper-bar"]
    assert "chosen" in rows[0][1] and "cut" in rows[2][1] and "cut" not in rows[1][1]
    assert "width:70.0%" in rows[0][1] and "width:30.0%" in rows[1][1]  # bars as long as the probabilities
    assert "token 4" in html and "temperature 0.7, top-k 2" in html


def test_the_cache_gauge_fills_as_far_as_the_cache():
    html = cache_html(_step(0, ord("A"), 5.0, tokens=10, capacity=40))
    assert "10 of 40 positions" in html and "width:25.0%" in html and "0.00 MB of 0.00 MB" in html


def test_times_put_prefill_and_steps_on_one_scale():
    steps = [_step(0, ord("A"), 40.0, fed=12)] + [_step(i, ord("A"), ms) for i, ms in enumerate([10.0, 20.0, 30.0], 1)]
    html = times_html(steps)
    widths = [float(w) for w in re.findall(r"width:([\d.]+)%", html)]
    assert widths == [100.0, 25.0, 50.0, 75.0]  # the slowest call is the full bar
    assert "12 tokens fed" in html and "median decode step 20.0 ms over 3 steps" in html
    assert "median" not in times_html(steps[:1])  # a prefill alone has no decode steps to sum up


def test_attention_shades_each_token_by_its_weight():
    assert attention_html(CharTokenizer(), [97, 98], None, 0, 0) == ""
    html = attention_html(CharTokenizer(), [97, 32, 99], torch.tensor([0.5, 0.25, 0.25]), layer=2, head=1)
    assert re.findall(r"rgba\(229,57,53,([\d.]+)\)", html) == ["1.00", "0.50", "0.50"]  # relative to the largest
    assert "\u00b7" in html and "layer 2, head 1" in html  # the space is drawn, the head named


def test_the_grammar_chart_strikes_out_what_the_grammar_removed_beside_what_it_kept():
    candidates = [Candidate(72, "Hi", 0.0, 0.5, allowed=False), Candidate(123, "{", 1.0, 0.2),
                  Candidate(66, "<b>", 0.0, 0.1, allowed=False)]
    step = _step(0, 123, 2.0, candidates=candidates)
    step.allowed_tokens = 3
    html = grammar_chart_html(step, 49152)
    rows = re.findall(r'<tr class="(la-stepper-bar[^"]*)" title="id (\d+)"', html)
    assert rows == [("la-stepper-bar la-stepper-removed", "72"), ("la-stepper-bar la-stepper-kept la-stepper-chosen",
                                                                  "123"), ("la-stepper-bar la-stepper-removed", "66")]
    assert html.count("removed by the grammar") == 2 and "<s>Hi</s>" in html and "<s>&lt;b&gt;</s>" in html
    assert "allows 3 of the 49,152 tokens" in html and "100.0%" in html and "automaton state" not in html
    from llm_anatomy.constrained.constraint import MaskLookup

    assert "automaton state 7; its mask computed now, on the state's first visit (12.50 ms)" in grammar_chart_html(
        step, 49152, MaskLookup(7, False, 0.0125))
    assert "its mask looked up" in grammar_chart_html(step, 49152, MaskLookup(7, True, 1e-5))
