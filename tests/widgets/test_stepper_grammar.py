"""The stepper with a schema (notebook 12, issue 50): every token under the grammar, the candidates it removed shown
beside those it kept; callbacks called directly on the real model, no browser."""

from __future__ import annotations

import json
import re

import pytest

from llm_anatomy.constrained import DEAD, UnsupportedSchema, constrained_generate, parses, schema_pattern
from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.widgets import Stepper

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "rank": {"type": "integer"}}, "required": ["city", "rank"]}


@pytest.fixture(scope="module")
def greedy(real, real_scratch):
    """One greedy stepper, run to its end once for the module, with every step's chart and the ids before it."""
    stepper = Stepper(model=real_scratch, tokenizer=real.tokenizer, schema=SCHEMA, max_new_tokens=40,
                      temperature=0.0)
    stepper.session.constraint.masker.cache.clear()  # one masker per schema and tokenizer: start with no mask known
    stepper.on_prefill()
    charts = [(list(stepper.session.generated[:-1]), stepper.chart.value)]
    while not stepper.session.finished:
        stepper.on_step()
        charts.append((list(stepper.session.generated[:-1]), stepper.chart.value))
    return stepper, charts


def _rows(chart: str) -> list[tuple[str, int]]:
    return [(kind, int(tid)) for kind, tid in re.findall(r'<tr class="la-stepper-bar la-stepper-(kept|removed)[^"]*" '
                                                         r'title="id (\d+)"', chart)]


def _answer(stepper) -> str:
    return stepper.session.tokenizer.decode(stepper.session.generated, skip_special_tokens=True)


def test_the_answer_parses_and_is_the_libraries_constrained_greedy_answer(real, real_scratch, greedy):
    stepper, _ = greedy
    assert stepper.error.text == "" and stepper.session.last.stop_reason == "eos", stepper.error.text
    assert parses(_answer(stepper), SCHEMA), _answer(stepper)
    masker = stepper.session.constraint.masker  # the schema's TokenMasker, its masks cached by the widget's run
    assert masker.dfa.pattern == schema_pattern(SCHEMA)
    same = constrained_generate(real_scratch, real.tokenizer, stepper.session.prompt_ids, masker,
                                SamplingParams(temperature=0.0), max_new_tokens=40)
    assert same.finished and same.ids + [real.tokenizer.eos_token_id] == stepper.session.generated


def test_removed_candidates_are_refused_by_the_mask_and_kept_ones_allowed(greedy):
    stepper, charts = greedy
    grammar = stepper.session.constraint
    removed_seen = 0
    for before, chart in charts:
        allowed = grammar.allowed(before)
        rows = _rows(chart)
        assert rows and any(kind == "kept" for kind, _ in rows)
        for kind, tid in rows:
            assert bool(allowed[tid]) == (kind == "kept"), (before, kind, tid)
        removed_seen += sum(kind == "removed" for kind, _ in rows)
        assert chart.count("removed by the grammar") == sum(kind == "removed" for kind, _ in rows)
        assert f"allows {int(allowed.sum()):,} of the 49,152 tokens" in chart
        assert chart.count("la-stepper-chosen") == 1
    first = charts[0][1]
    assert _rows(first)[0][0] == "removed" and "<s>" in first  # the model's own favourite is not JSON's `{`
    assert f"automaton state {grammar.masker.dfa.start}; its mask computed now" in first
    assert removed_seen > len(charts)


def test_play_samples_under_the_grammar_and_reset_restarts_the_automaton(real, real_scratch):
    stepper = Stepper(model=real_scratch, tokenizer=real.tokenizer, schema=SCHEMA, max_new_tokens=40,
                      temperature=1.0, top_p=1.0, seed=3)
    stepper.on_prefill()
    stepper.on_step()
    grammar = stepper.session.constraint
    assert grammar.state(stepper.session.generated) not in (DEAD, grammar.masker.dfa.start)
    stepper.on_reset()
    assert stepper.session.generated == [] and stepper.chart.value == ""
    stepper.on_prefill()
    assert grammar.state(stepper.session.generated[:-1]) == grammar.masker.dfa.start  # from the start again
    assert "its mask looked up: this state was seen before" in stepper.chart.value  # cached since the first prefill
    stepper.on_play()
    stepper._thread.join(120)
    assert not stepper.playing and stepper.error.text == "" and stepper.session.last.stop_reason == "eos"
    assert parses(_answer(stepper), SCHEMA), _answer(stepper)


def test_a_schema_outside_the_subset_is_refused_in_the_widget_and_changes_nothing(real, real_scratch):
    with pytest.raises(UnsupportedSchema, match="'pattern'"):
        Stepper(model=real_scratch, tokenizer=real.tokenizer, schema={"type": "string", "pattern": "a+"})
    stepper = Stepper(model=real_scratch, tokenizer=real.tokenizer, schema=SCHEMA, max_new_tokens=4, temperature=0.0)
    stepper.on_prefill()
    stepper.on_step()
    grammar, before = stepper.session.constraint, (stepper.session.generated[:], stepper.chart.value,
                                                   stepper.text.value)
    for text, words in [(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}, "required": []}),
                         "optional properties"), ('{"type": "object",', "not JSON"),
                        (json.dumps({"type": "string", "format": "date"}), "'format'")]:
        stepper.schema_box.value = text
        assert words in stepper.error.text, stepper.error.text
        stepper.on_prefill()
        assert words in stepper.error.text, stepper.error.text
        assert stepper.session.constraint is grammar
        assert (stepper.session.generated, stepper.chart.value, stepper.text.value) == before
    stepper.schema_box.value = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                           "required": ["ok"]})
    assert "next Prefill" in stepper.error.text
    stepper.max_new.value = 12
    stepper.on_prefill()
    while not stepper.session.finished:
        stepper.on_step()
    assert stepper.error.text == "" and stepper.session.constraint is not grammar
    assert stepper.session.last.stop_reason == "eos", _answer(stepper)
    assert json.loads(_answer(stepper)).keys() == {"ok"}


def test_without_a_schema_the_stepper_has_no_grammar(real, real_scratch):
    stepper = Stepper(model=real_scratch, tokenizer=real.tokenizer, max_new_tokens=2, temperature=0.0)
    stepper.on_prefill()
    assert stepper.schema_box is None and stepper.session.constraint is None
    assert "la-stepper-schema" not in str([c._dom_classes for c in stepper.children])
    assert "under the grammar" not in stepper.chart.value and "removed" not in stepper.chart.value
