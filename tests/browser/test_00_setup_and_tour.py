"""Notebook 00 in a real JupyterLab: it runs top to bottom and the model answers the chat question."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1500)]


def test_notebook_00_runs_and_the_model_answers_paris(notebook_page):
    ui = notebook_page
    ui.open("00_setup_and_tour.ipynb")
    seconds = ui.run_all()
    print(f"notebook 00 ran in the browser in {seconds:.0f} s")

    answer = ui.panel.locator(".jp-OutputArea-output", has_text=re.compile(r"answered in [\d.]+ s on"))
    assert answer.count() == 1, "the chat cell printed no 'answered in ... s' line"
    assert "Paris" in answer.inner_text(), f"the chat answer does not mention Paris: {answer.inner_text()!r}"
    answer.scroll_into_view_if_needed()
    ui.screenshot(answer, "00_chat_answer")

    # The environment report and the model's configuration printed too.
    text = ui.outputs_text()
    assert re.search(r"key/value heads\s+3", text), "the configuration cell did not print 3 key/value heads"
    ui.assert_no_widget_errors()
