"""The serving stepper's callbacks, called directly (no browser): submit, step, run to the end, reset, refusals."""

from __future__ import annotations

import re

import pytest
import torch
from llm_anatomy.weights.random import random_llama

from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.widgets.scheduler import SchedulerWidget


@pytest.fixture(scope="module")
def tiny():
    return ScratchLlama.from_hf(random_llama())


@pytest.fixture
def widget(tiny):
    return SchedulerWidget(tiny, num_blocks=16, block_size=4, max_batch=2, max_batched_tokens=16,
                           shared_prefix=list(range(3, 11)), tokens=list(range(20, 120)))


def _blocks(widget, kind):
    return len(re.findall(rf'class="la-serving-block la-serving-{kind}"', widget.view.value))


def _state(widget):
    s = widget.scheduler
    return ([r.id for r in s.waiting], [a.request.id for a in s.running], len(s.finished), s.pool.allocator.num_free,
            s.steps, widget._start, widget.view.value)


def test_the_widget_carries_its_css_classes(widget):
    assert "la-serving" in widget._dom_classes
    for part, w in [("prompt", widget.prompt_box), ("output", widget.output_box), ("shared", widget.shared_box),
                    ("submit", widget.submit_button), ("step", widget.step_button), ("run", widget.run_button),
                    ("reset", widget.reset_button), ("view", widget.view), ("error", widget.error)]:
        assert f"la-serving-{part}" in w._dom_classes, part
    assert _blocks(widget, "free") == 16 and "0 in the batch, 0 waiting" in widget.view_text


def test_requests_join_grow_share_and_leave_in_place(widget, tiny):
    children = list(widget.children)
    first = widget.submit(6, 3)  # 8 shared + 6 fresh tokens = 14 positions
    assert widget.error.text == "" and first.prompt[:8] == list(range(3, 11))
    assert "la-serving-waiting" in widget.view.value and "1 waiting" in widget.view_text
    widget.step()  # admitted; its prompt (14 tokens <= budget 16) runs at once and gives the first token
    assert len(first.output) == 1 and _blocks(widget, "used") == 4  # ceil(14 / 4)
    assert 'data-request="0"' in widget.view.value and "la-serving-decoding" in widget.view.value
    second = widget.submit(2, 2, shared=True)  # same 8-token prefix: its 2 full blocks come from the prefix cache
    widget.step()
    tables = [widget.scheduler.admission_of(r).blocks for r in (first, second)]
    assert second.cached == 8 and tables[1][:2] == tables[0][:2]
    assert _blocks(widget, "shared") == 2
    widget.run_to_end()
    assert not widget.scheduler.running and len(widget.scheduler.finished) == 2
    assert _blocks(widget, "used") == 0 and _blocks(widget, "cached") > 0  # kept for later requests
    assert widget.view_text.count("finished") >= 2
    for r in (first, second):
        alone = generate_greedy(tiny, torch.tensor([r.prompt]), r.max_new_tokens).tokens[0].tolist()
        assert r.output == alone
    assert list(widget.children) == children  # the same widget, updated in place


@pytest.mark.parametrize("args, words", [((0, 3, False), "at least 1"), ((-2, 3, True), "at least 0"),
                                         ((3, 0, True), "max_new_tokens"), ((60, 20, True), "whole KV pool"),
                                         ((3.5, 2, True), "fresh tokens"), ((500, 2, False), "At most 100")])
def test_bad_requests_are_named_and_change_nothing(widget, args, words):
    widget.submit(3, 2)
    widget.step()
    before = _state(widget)
    assert widget.submit(*args) is None
    assert words in widget.error.text
    assert _state(widget) == before
    widget.step()
    assert widget.error.text == ""  # the next good action clears the message


def test_step_with_nothing_to_do_says_so_and_reset_empties_the_pool(widget):
    widget.step()
    assert "Nothing to do" in widget.error.text and widget.scheduler.steps == 0
    widget.submit(4, 5)
    widget.step()
    assert widget.scheduler.pool.allocator.num_free < 16
    widget.reset()
    assert widget.scheduler.steps == 0 and widget.scheduler.pool.allocator.num_free == 16
    assert _blocks(widget, "free") == 16 and widget.error.text == ""


def test_the_buttons_call_the_methods(widget):
    widget.prompt_box.value, widget.output_box.value, widget.shared_box.value = 5, 2, False
    widget.submit_button.click()
    assert len(widget.scheduler.waiting) == 1 and len(widget.scheduler.waiting[0].prompt) == 5
    widget.step_button.click()
    assert widget.scheduler.steps == 1
    widget.run_button.click()
    assert len(widget.scheduler.finished) == 1
    widget.reset_button.click()
    assert widget.scheduler.steps == 0


def test_a_small_pool_preempts_and_keeps_the_tokens(tiny):
    w = SchedulerWidget(tiny, num_blocks=6, block_size=4, max_batch=3, max_batched_tokens=None,
                        shared_prefix=[], tokens=list(range(20, 120)))
    reqs = [w.submit(5, 10, shared=False) for _ in range(3)]  # 15 positions = 4 blocks each, 6 blocks in all
    w.run_to_end()
    assert all(r.done for r in reqs) and sum(r.preempted for r in reqs) > 0
    assert "preempted" in w.view_text
    for r in reqs:
        assert r.output == generate_greedy(tiny, torch.tensor([r.prompt]), 10).tokens[0].tolist()
