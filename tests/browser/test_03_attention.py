"""Notebook 03's attention explorer in a real JupyterLab: sliders and the prompt redraw the heatmap.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/attention_explorer.py),
never by cell numbers.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]

PROMPT = "One two three four"


def test_attention_explorer(notebook_page, reference_tokenizer):
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open_widget("03_attention.ipynb", "AttentionExplorer(")

    root = ui.widget("la-attention")
    caption = root.locator(".la-attention-caption")
    heatmap = root.locator(".la-attention-heatmap")
    error = root.locator(".la-attention-error")
    expect(caption).to_contain_text("each row is a query", timeout=60_000)
    start_png = ui.image_digest(heatmap)
    assert start_png[0] > 1000, "the heatmap is empty"
    ui.screenshot(root, "03_attention_start")

    # Move the layer slider: the caption names the new layer, and the picture changes.
    ui.set_slider(root.locator(".la-attention-layer"), 5)
    expect(caption).to_contain_text("layer 5, head", timeout=60_000)
    layer_png = ui.wait_image_change(heatmap, start_png)
    # Then the head slider: head 4 of 9 query heads reads KV head 1 of 3 (grouped-query attention).
    ui.set_slider(root.locator(".la-attention-head"), 4)
    expect(caption).to_contain_text("layer 5, head 4 (reads KV head 1)", timeout=60_000)
    ui.wait_image_change(heatmap, layer_png)
    ui.assert_error_line_empty("la-attention-error")
    ui.screenshot(root, "03_attention_layer5_head4")

    # A new prompt, shown with the button: the caption counts its tokens.
    n_tokens = len(reference_tokenizer(PROMPT, add_special_tokens=False).input_ids)
    root.locator(".la-attention-prompt textarea").fill(PROMPT)
    root.locator(".la-attention-show").click()
    expect(caption).to_contain_text(f"{n_tokens} tokens", timeout=60_000)
    ui.assert_error_line_empty("la-attention-error")
    kept_png = ui.wait_image_change(heatmap, layer_png)

    # An empty prompt is refused inside the widget, and the last picture stays.
    root.locator(".la-attention-prompt textarea").fill("")
    root.locator(".la-attention-show").click()
    expect(error).to_contain_text("Type a prompt first", timeout=60_000)
    assert ui.image_digest(heatmap) == kept_png, "a refused prompt changed the heatmap"
    ui.screenshot(root, "03_attention_refused")

    ui.assert_no_widget_errors()
