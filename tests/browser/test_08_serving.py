"""Notebook 08's serving stepper in a real JupyterLab: submit requests, step the scheduler, watch the KV blocks.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/scheduler.py), never by cell numbers.
The notebook builds it with a pool of 32 blocks of 8 positions and a 24-token shared prefix (the chat template's
system prompt), a batch of 4 and a budget of 64 tokens per iteration.
"""

from __future__ import annotations

import re

import pytest
from controls import set_number

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]



def _summary(root) -> str:
    return root.locator(".la-serving-summary").inner_text()


def test_serving_stepper(notebook_page):
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open_widget("08_serving.ipynb", "SchedulerWidget(")

    root = ui.widget("la-serving")
    view, error = root.locator(".la-serving-view"), root.locator(".la-serving-error")
    blocks = root.locator(".la-serving-block")
    root.locator(".la-serving-reset").click()
    expect(root.locator(".la-serving-summary")).to_contain_text("iteration 0", timeout=60_000)
    expect(blocks).to_have_count(32)
    expect(root.locator(".la-serving-block.la-serving-free")).to_have_count(32)
    ui.screenshot(root, "08_serving_empty")

    # A request after the shared prefix: it waits, then one step admits it and prefills its prompt.
    set_number(root.locator(".la-serving-prompt"), 12)
    set_number(root.locator(".la-serving-output"), 4)
    shared = root.locator(".la-serving-shared input[type=checkbox]")
    if not shared.is_checked():
        shared.check()
    root.locator(".la-serving-submit").click()
    expect(root.locator(".la-serving-request.la-serving-waiting")).to_have_count(1, timeout=60_000)
    root.locator(".la-serving-step").click()
    expect(root.locator(".la-serving-summary")).to_contain_text("iteration 1", timeout=60_000)
    expect(root.locator(".la-serving-block.la-serving-used")).to_have_count(5)  # 24 + 12 = 36 positions in blocks of 8
    expect(root.locator(".la-serving-request.la-serving-decoding")).to_have_count(1)
    ui.assert_error_line_empty("la-serving-error")

    # A second request with the same prefix: its first 3 blocks come from the prefix cache, shared by both.
    root.locator(".la-serving-submit").click()
    root.locator(".la-serving-step").click()
    expect(root.locator(".la-serving-summary")).to_contain_text("iteration 2", timeout=60_000)
    expect(root.locator(".la-serving-block.la-serving-shared")).to_have_count(3, timeout=60_000)
    expect(root.locator('.la-serving-block.la-serving-shared[data-block]').first).to_have_attribute(
        "title", re.compile(r"held by request 0,1, refcount 3"))
    ui.screenshot(root, "08_serving_shared")

    # Run to the end: both leave the batch, their blocks are freed, the prefix stays cached.
    root.locator(".la-serving-run").click()
    expect(root.locator(".la-serving-request.la-serving-finished")).to_have_count(2, timeout=120_000)
    expect(root.locator(".la-serving-block.la-serving-used")).to_have_count(0)
    assert root.locator(".la-serving-block.la-serving-cached").count() >= 3
    assert "0 in the batch, 0 waiting, 2 finished" in _summary(root)

    # A request longer than the whole pool: refused with a clear message, nothing changes.
    kept = view.inner_html()
    set_number(root.locator(".la-serving-prompt"), 300)
    root.locator(".la-serving-submit").click()
    expect(error).to_contain_text("more than the whole KV pool holds", timeout=60_000)
    assert view.inner_html() == kept, "a refused request changed the view"
    ui.screenshot(root, "08_serving_refused")
    set_number(root.locator(".la-serving-prompt"), 4)
    root.locator(".la-serving-submit").click()
    expect(error).to_have_text("", timeout=60_000)
    expect(root.locator(".la-serving-request.la-serving-waiting")).to_have_count(1)

    ui.assert_no_widget_errors()
