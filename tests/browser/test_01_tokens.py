"""Notebook 01's tokenizer playground in a real JupyterLab: typing re-tokenizes, ids match the model's.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/playground.py), never by
cell numbers, so the notebook's text can change freely around it.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]

TEXT = "Hello world! Café 東京 👋 2024"
LONG_WORD = "x" * 201  # the merge trace refuses more than 200 characters


def test_tokenizer_playground(notebook_page, reference_tokenizer):
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open_widget("01_tokens.ipynb", "TokenizerPlayground(")

    root = ui.widget("la-playground")
    summary = root.locator(".la-playground-summary")
    tokens = root.locator(".la-playground-tokens .la-token")
    ids_row = root.locator(".la-playground-ids tr").first  # "ours"
    expect(summary).to_contain_text("tokens")
    assert tokens.count() > 0, "the playground shows no tokens for its sample text"
    ui.screenshot(root, "01_playground_sample")

    # Type: the summary, the coloured tokens and the id table follow, and agree with the model's tokenizer.
    expected = reference_tokenizer(TEXT, add_special_tokens=False).input_ids
    root.locator(".la-playground-text textarea").fill(TEXT)
    expect(summary).to_contain_text(f"{len(expected)} tokens", timeout=60_000)
    expect(summary).to_contain_text(f"{len(TEXT)} characters")
    expect(summary).to_contain_text(f"{len(TEXT.encode('utf-8'))} bytes")
    expect(tokens).to_have_count(len(expected))
    shown_ids = [int(t) for t in re.findall(r"\d+", ids_row.inner_text())]
    assert shown_ids == expected, f"the playground shows ids {shown_ids}, the model's tokenizer gives {expected}"
    assert [int(t.get_attribute("data-id")) for t in tokens.all()] == expected
    expect(root.locator(".la-id-mismatch")).to_have_count(0)
    expect(root.locator(".la-playground-ids")).to_contain_text("same ids as the reference")
    ui.assert_error_line_empty("la-playground-error")
    ui.screenshot(root, "01_playground_typed")

    # The merge trace follows the word box; a refused word shows an error and keeps the last trace.
    word = root.locator(".la-playground-word input")
    trace = root.locator(".la-playground-trace")
    word.fill(" hello")
    expect(trace).to_contain_text("merge #", timeout=60_000)
    hello_ids = reference_tokenizer(" hello", add_special_tokens=False).input_ids
    expect(trace).to_contain_text(", ".join(map(str, hello_ids)))
    before = trace.inner_text()
    word.fill(LONG_WORD)
    expect(root.locator(".la-playground-error")).to_contain_text("200 characters", timeout=60_000)
    assert trace.inner_text() == before, "a refused word changed the trace"
    word.fill(" tokens")
    expect(root.locator(".la-playground-error")).to_have_text("", timeout=60_000)
    ui.screenshot(root, "01_playground_trace")

    ui.assert_no_widget_errors()
