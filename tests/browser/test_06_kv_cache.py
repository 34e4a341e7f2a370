"""Notebook 06's KV memory calculator in a real JupyterLab: every control recomputes the result in place.

The widget's parts are found by their CSS classes (lib/llm_anatomy/widgets/kv_calculator.py), never by
cell numbers. The expected figures follow the formula 2 x layers x kv_heads x head_dim x bytes.
"""

from __future__ import annotations

import pytest
from controls import set_number

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]

# Llama-2-7B: 32 layers, 32 KV heads of 128 -> 2 * 32 * 32 * 128 * 2 bytes (bf16) = 524,288 bytes per token.
PER_TOKEN = 2 * 32 * 32 * 128 * 2



def _row(result, label: str):
    """The result table's row whose first cell starts with `label`."""
    return result.locator("tr", has=result.page.locator("td", has_text=label)).first


def test_kv_calculator(notebook_page):
    from playwright.sync_api import expect

    ui = notebook_page
    ui.open_widget("06_kv_cache.ipynb", "KVCalculator(")

    root = ui.widget("la-kvcalc")
    result = root.locator(".la-kvcalc-result")
    error = root.locator(".la-kvcalc-error")
    expect(result).to_contain_text("KV bytes per token", timeout=60_000)
    ui.screenshot(root, "06_kvcalc_start")

    # A model with one KV head per query head (MHA), in bf16, one user of 4,096 tokens.
    root.locator(".la-kvcalc-model select").select_option("Llama-2-7B")
    root.locator(".la-kvcalc-dtype select").select_option("bf16")
    set_number(root.locator(".la-kvcalc-users"), 1)
    set_number(root.locator(".la-kvcalc-length"), 4096)
    expect(_row(result, "KV bytes per token")).to_contain_text(f"{PER_TOKEN:,} B", timeout=60_000)
    expect(_row(result, "per user (4,096 tokens)")).to_contain_text(f"{PER_TOKEN * 4096 / 2**30:,.3f} GiB",
                                                                   timeout=60_000)  # 2.000 GiB
    expect(result).to_contain_text("Llama-2-7B, bf16")

    # Ten users: ten times the memory. fp32: twice the bytes per token.
    set_number(root.locator(".la-kvcalc-users"), 10)
    expect(_row(result, "total (10 users)")).to_contain_text(f"{PER_TOKEN * 4096 * 10 / 2**30:,.3f} GiB",
                                                            timeout=60_000)  # 20.000 GiB
    root.locator(".la-kvcalc-dtype select").select_option("fp32")
    expect(_row(result, "KV bytes per token")).to_contain_text(f"{2 * PER_TOKEN:,} B", timeout=60_000)
    # A small GPU: 10 users of 4,096 tokens of a 7B model in fp32 do not fit in 16 GiB.
    set_number(root.locator(".la-kvcalc-memory"), 16)
    expect(result).to_contain_text("does not fit in 16 GiB", timeout=60_000)
    ui.assert_error_line_empty("la-kvcalc-error")
    ui.screenshot(root, "06_kvcalc_changed")

    # A refused value: the error line names it, and the last good result stays.
    kept = result.inner_text()
    set_number(root.locator(".la-kvcalc-length"), 0)
    expect(error).to_contain_text("sequence length must be at least 1", timeout=60_000)
    assert result.inner_text() == kept, "a refused length changed the result"
    ui.screenshot(root, "06_kvcalc_refused")
    set_number(root.locator(".la-kvcalc-length"), 2048)
    expect(error).to_have_text("", timeout=60_000)
    expect(_row(result, "per user (2,048 tokens)")).to_contain_text(f"{2 * PER_TOKEN * 2048 / 2**30:,.3f} GiB")

    ui.assert_no_widget_errors()
