"""Notebook 05's generation stepper in a real JupyterLab: Prefill, Step, Play and Reset, token by token.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/stepper.py), never by cell
numbers. Greedy decoding (temperature 0) makes the answer repeatable: the model says Paris.
"""

from __future__ import annotations

import re

import pytest
from controls import set_number, stepper_greedy_chat

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]

PROMPT = "What is the capital of France?"



def _cache_positions(cache) -> int:
    match = re.search(r"KV cache: (\d+) of (\d+) positions", cache.inner_text())
    assert match, f"the cache gauge reads {cache.inner_text()!r}"
    return int(match.group(1))


def test_generation_stepper(notebook_page, reference_tokenizer):
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open_widget("05_generation.ipynb", "Stepper(loaded")

    root = ui.widget("la-stepper")
    status, text = root.locator(".la-stepper-status"), root.locator(".la-stepper-text")
    tokens, cache = root.locator(".la-stepper-text .la-stepper-token"), root.locator(".la-stepper-cache")
    error = root.locator(".la-stepper-error")

    # Start clean, greedy, with the chat template.
    root.locator(".la-stepper-reset").click()
    expect(status).to_contain_text("press Prefill", timeout=60_000)
    stepper_greedy_chat(root, PROMPT, 40)

    # Prefill: the whole prompt in one call, its K and V in the cache, and the first new token.
    root.locator(".la-stepper-prefill").click()
    expect(status).to_contain_text("1 new token ·", timeout=60_000)
    expect(tokens).to_have_count(1)
    expect(root.locator(".la-stepper-chart .la-stepper-chosen")).to_have_count(1)
    expect(root.locator(".la-stepper-chart")).to_contain_text("Next-token candidates")
    prompt_tokens = int(re.search(r"prompt (\d+) tokens", status.inner_text()).group(1))
    assert prompt_tokens > len(reference_tokenizer(PROMPT, add_special_tokens=False).input_ids), \
        "with the chat template the prompt must be longer than the question alone"
    assert _cache_positions(cache) == prompt_tokens
    expect(root.locator(".la-stepper-times")).to_contain_text(f"{prompt_tokens} tokens fed")
    ui.assert_error_line_empty("la-stepper-error")
    ui.screenshot(root, "05_stepper_prefill")

    # Step: one more token, fed alone; the cache grows by one position.
    root.locator(".la-stepper-step").click()
    expect(status).to_contain_text("2 new tokens", timeout=60_000)
    expect(tokens).to_have_count(2)
    expect(root.locator(".la-stepper-token-new")).to_have_count(1)
    assert _cache_positions(cache) == prompt_tokens + 1
    expect(root.locator(".la-stepper-times")).to_contain_text("1 token fed")

    # Play until the model ends its turn (greedy: a short answer naming Paris).
    play = root.locator(".la-stepper-play")
    play.click()
    expect(status).to_contain_text("finished", timeout=180_000)
    expect(play).to_contain_text("Play", timeout=30_000)
    assert "Paris" in text.inner_text(), f"the greedy answer does not name Paris: {text.inner_text()!r}"
    n = tokens.count()
    assert n > 2 and f"{n} new tokens" in status.inner_text()
    ui.assert_error_line_empty("la-stepper-error")
    ui.screenshot(root, "05_stepper_finished")

    # A refused setting: shown in the widget, nothing else changes.
    kept = text.inner_text()
    set_number(root.locator(".la-stepper-top-k"), -1)
    expect(error).to_contain_text("top-k must be 0", timeout=60_000)
    assert text.inner_text() == kept
    set_number(root.locator(".la-stepper-top-k"), 50)

    # min-p and the penalties, the same way: a refused value in the widget's error line, the text untouched;
    # a good value clears the line
    set_number(root.locator(".la-stepper-min-p"), 1.5)
    expect(error).to_contain_text("min_p must be in [0, 1]", timeout=60_000)
    assert text.inner_text() == kept
    set_number(root.locator(".la-stepper-min-p"), 0.1)
    expect(error).to_have_text(re.compile(r"^\s*$"), timeout=60_000)
    set_number(root.locator(".la-stepper-repetition"), 0)
    expect(error).to_contain_text("repetition_penalty must be a finite number > 0", timeout=60_000)
    assert text.inner_text() == kept
    set_number(root.locator(".la-stepper-repetition"), 1)
    expect(error).to_have_text(re.compile(r"^\s*$"), timeout=60_000)

    # Reset clears the text and the cache gauge.
    root.locator(".la-stepper-reset").click()
    expect(status).to_contain_text("press Prefill", timeout=60_000)
    expect(tokens).to_have_count(0)

    ui.assert_no_widget_errors()
