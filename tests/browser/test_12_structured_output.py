"""Notebook 12's stepper under a grammar, in a real JupyterLab: Prefill, Step, Play and Reset with a JSON schema,
the candidates the grammar removed struck out beside those it kept, and a schema outside the subset refused in the
widget's error line.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/stepper.py). The test types its own
schema and prompt into the widget (whatever the notebook shows), and decodes greedily, so the answer is repeatable:
it ends with the end-of-turn token and parses.
"""

from __future__ import annotations

import json
import re

import pytest
from controls import stepper_greedy_chat

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "rank": {"type": "integer"}}, "required": ["city", "rank"]}
PROMPT = f"Describe Paris as JSON that follows this schema: {json.dumps(SCHEMA)}"
OUTSIDE = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^P"}}, "required": ["city"]}



def _set_schema(root, schema) -> None:
    box = root.locator(".la-stepper-schema textarea")
    box.fill(json.dumps(schema))
    box.blur()  # the box sends its text when it loses focus (continuous_update=False)


def test_generation_stepper_under_a_grammar(notebook_page):
    from playwright.sync_api import expect

    from llm_anatomy.constrained import parses

    ui = notebook_page
    ui.open_widget("12_structured_output.ipynb", "Stepper(loaded, schema=")

    root = ui.widget("la-stepper")
    status, chart = root.locator(".la-stepper-status"), root.locator(".la-stepper-chart")
    tokens, error = root.locator(".la-stepper-text .la-stepper-token"), root.locator(".la-stepper-error")
    expect(root.locator(".la-stepper-schema textarea")).to_have_count(1)

    # Start clean, greedy, with the chat template and the test's own schema.
    root.locator(".la-stepper-reset").click()
    expect(status).to_contain_text("press Prefill", timeout=60_000)
    changed = root.locator(".la-stepper-schema textarea").input_value() != json.dumps(SCHEMA)
    _set_schema(root, SCHEMA)
    if changed:
        expect(error).to_contain_text("applies from the next Prefill", timeout=60_000)
    stepper_greedy_chat(root, PROMPT, 40)

    # Prefill: the first token under the grammar; the model's favourites that are not JSON are struck out.
    root.locator(".la-stepper-prefill").click()
    expect(status).to_contain_text("1 new token ·", timeout=60_000)
    expect(chart).to_contain_text("under the grammar")
    expect(chart.locator(".la-stepper-kept.la-stepper-chosen")).to_have_count(1)
    assert chart.locator(".la-stepper-removed").count() > 0 and chart.locator(".la-stepper-kept").count() > 0
    expect(chart.locator(".la-stepper-removed").first).to_contain_text("removed by the grammar")
    allowed = re.search(r"allows ([\d,]+) of the 49,152 tokens", chart.inner_text())
    assert allowed and 0 < int(allowed.group(1).replace(",", "")) < 49_152, chart.inner_text()
    ui.assert_error_line_empty("la-stepper-error")
    ui.screenshot(root, "12_stepper_prefill")

    # Step, then Play to the end: the answer ends (the grammar allowed the end-of-turn token) and parses.
    root.locator(".la-stepper-step").click()
    expect(status).to_contain_text("2 new tokens", timeout=60_000)
    root.locator(".la-stepper-play").click()
    expect(status).to_contain_text("finished: the model ended its turn", timeout=180_000)
    expect(root.locator(".la-stepper-play")).to_contain_text("Play", timeout=30_000)
    answer = "".join(tokens.all_inner_texts()).replace("<|im_end|>", "")
    assert parses(answer, SCHEMA), f"the answer under the grammar does not parse: {answer!r}"
    ui.assert_error_line_empty("la-stepper-error")
    ui.screenshot(root, "12_stepper_finished")

    # A schema outside the subset: its sentence in the error line, and nothing else changes, at Prefill too.
    kept, kept_chart = root.locator(".la-stepper-text").inner_text(), chart.inner_text()
    _set_schema(root, OUTSIDE)
    expect(error).to_contain_text("'pattern'", timeout=60_000)
    root.locator(".la-stepper-prefill").click()
    expect(error).to_contain_text("the course's subset does not support", timeout=60_000)
    assert root.locator(".la-stepper-text").inner_text() == kept and chart.inner_text() == kept_chart

    # Reset clears the text; the automaton starts again at the next Prefill (the schema put back).
    _set_schema(root, SCHEMA)
    expect(error).to_contain_text("applies from the next Prefill", timeout=60_000)
    root.locator(".la-stepper-reset").click()
    expect(status).to_contain_text("press Prefill", timeout=60_000)
    expect(tokens).to_have_count(0)
    root.locator(".la-stepper-prefill").click()
    expect(status).to_contain_text("1 new token ·", timeout=60_000)
    assert re.search(r"allows ([\d,]+) of", chart.inner_text()).group(1) == allowed.group(1)
    expect(chart.locator(".la-stepper-mask-cost")).to_contain_text("looked up: this state was seen before")

    ui.assert_no_widget_errors()
