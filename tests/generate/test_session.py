"""The generation session: greedy stepping equals transformers' generate; seeds; refusals leave state unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from llm_anatomy.generate.chat import chat_prompt_ids
from llm_anatomy.errors import CourseError
from llm_anatomy.generate.session import GenerationSession, generate
from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.serve.batching import Request


@pytest.fixture(scope="module")
def scratch(real_scratch):
    return real_scratch  # conftest.py's, shared with other files; the tests here only run it


def _state(session):
    return (list(session.prompt_ids), list(session.generated), len(session.steps), session.params,
            None if session.cache is None else session.cache.length, session.prefill_ms,
            None if session._logits is None else session._logits.clone())


def _same_state(a, b):
    return a[:6] == b[:6] and (a[6] is None) == (b[6] is None) and (a[6] is None or torch.equal(a[6], b[6]))


def test_greedy_steps_equal_transformers_generate_on_a_chat_prompt(real, scratch, greedy_reference):
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=32))
    results = session.generate("What is the capital of France?", chat=True)
    ids = chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])[0].tolist()
    assert session.prompt_ids == ids
    assert session.generated == greedy_reference(ids, 32)
    assert "Paris" in session.text
    # one model call per token: the prompt once, then one new position per step
    assert [r.fed_tokens for r in results] == [len(ids)] + [1] * (len(results) - 1)
    assert [r.cache_tokens for r in results] == [len(ids) + i for i in range(len(results))]
    assert results[-1].finished and results[-1].stop_reason in ("eos", "length")
    if results[-1].stop_reason == "eos":
        assert session.generated[-1] == real.tokenizer.eos_token_id


def test_greedy_steps_equal_transformers_generate_on_a_plain_prompt(real, scratch, greedy_reference):
    prompt = "Once upon a time, in a small village by the sea,"
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=32))
    results = session.generate(prompt, chat=False)
    ids = real.tokenizer(prompt)["input_ids"]
    assert session.prompt_ids == ids
    assert session.generated == greedy_reference(ids, 32)
    assert len(results) == 32 and results[-1].stop_reason == "length"
    assert generate(scratch, real.tokenizer, prompt, max_new_tokens=5, chat=False) == \
        real.tokenizer.decode(session.generated[:5], skip_special_tokens=True)


def test_step_results_carry_what_the_view_needs(real, scratch):
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=8),
                                attention=(3, 2), top_n=5)
    first = session.prefill("Name a colour.")
    second = session.step()
    n_prompt = len(session.prompt_ids)
    assert first.index == 0 and second.index == 1 and session.prefill_ms == first.ms > 0 and second.ms > 0
    for r in (first, second):
        assert r.candidates[0].token_id == r.token_id == r.candidates[r.chosen_rank].token_id  # greedy: the best
        assert r.prob == 1.0 and len(r.candidates) == 5  # greedy keeps one token; the others are shown as cut
        assert [c.prob for c in r.candidates[1:]] == [0.0] * 4
        raw = [c.raw_prob for c in r.candidates]
        assert raw == sorted(raw, reverse=True) and 0 < raw[0] < 1
        assert r.text == real.tokenizer.decode([r.token_id])
    assert second.cache_tokens == n_prompt + 1
    per_position = 2 * 30 * 3 * 64 * 4  # K and V, layers, kv heads, head dim, fp32 bytes
    assert second.cache_bytes == per_position * (n_prompt + 1)
    assert second.cache_capacity_tokens == n_prompt + 8 and second.cache_capacity_bytes == per_position * (n_prompt + 8)
    # the attention row of the token fed last: over every position so far, a distribution
    assert first.attention.shape == (n_prompt,) and second.attention.shape == (n_prompt + 1,)
    assert torch.allclose(second.attention.sum(), torch.tensor(1.0), atol=1e-4)
    ref = scratch.trace(torch.tensor([session.prompt_ids + session.generated[:1]]), attention_layers=(3,))
    torch.testing.assert_close(second.attention, ref.attentions[3][0, 2, -1], atol=1e-5, rtol=1e-4)


def test_sampling_with_a_seed_is_reproducible(real, scratch):
    def run(seed):
        session = GenerationSession(scratch, real.tokenizer, SamplingParams(1.0, max_tokens=12, seed=seed))
        session.generate("Tell me a story about a dragon.")
        return session.generated

    a = run(1)
    assert run(1) == a
    assert run(2) != a
    # prefill again on the same session starts the generator over
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(1.0, max_tokens=12, seed=1))
    session.generate("Tell me a story about a dragon.")
    session.generate("Tell me a story about a dragon.")
    assert session.generated == a


def test_resample_reuses_the_logits_without_a_model_call(real, scratch, monkeypatch):
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=10, seed=3))
    session.prefill("Write one word.")
    session.step()
    calls = []
    original = scratch.trace
    monkeypatch.setattr(scratch, "trace", lambda *a, **k: calls.append(1) or original(*a, **k))
    cache_length, logits = session.cache.length, session._logits.clone()
    greedy_token = session.generated[-1]
    tokens = {session.resample(temperature=2.0, top_k=None, top_p=1.0).token_id for _ in range(15)}
    assert calls == [] and session.cache.length == cache_length and torch.equal(session._logits, logits)
    assert len(tokens) > 1, "at temperature 2 the draws should differ"
    assert session.params == SamplingParams(2.0, None, 1.0, seed=3, max_tokens=10, stop_token_ids=(2,))
    assert session.last.resampled and session.last.params == session.params
    back = session.resample(temperature=0.0)
    assert back.token_id == greedy_token and session.generated[-1] == greedy_token and len(session.generated) == 2
    assert calls == []
    one = session.resample(temperature=1.0, top_k=1)
    assert one.token_id == greedy_token and one.candidates[0].prob == 1.0
    session.step()
    assert calls == [1]


def test_bad_calls_are_refused_and_change_nothing(real, scratch):
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=3))
    with pytest.raises(CourseError, match="prefill"):
        session.step()
    with pytest.raises(CourseError, match="empty"):
        session.prefill("   ")
    with pytest.raises(CourseError, match="empty"):
        session.prefill([])
    with pytest.raises(CourseError, match="at most 8192"):
        session.prefill("word " * 9000, chat=False)
    with pytest.raises(CourseError, match="at most 8192"):
        session.prefill(list(range(100, 8292)))
    assert not session.prefilled and session.generated == []

    session.prefill("Say hi.")
    before = _state(session)
    for bad in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.01),
                dict(top_k=0), dict(top_k=2.5)):
        with pytest.raises(CourseError):
            session.resample(**bad)
        with pytest.raises(CourseError):
            session.set_settings(**bad)
        assert _same_state(_state(session), before)
    with pytest.raises(CourseError, match="attention"):
        session.set_attention((30, 0))
    with pytest.raises(CourseError, match="empty"):
        session.prefill("")
    assert _same_state(_state(session), before)

    while not session.finished:
        session.step()
    after = _state(session)
    with pytest.raises(CourseError, match="finished"):
        session.step()
    assert _same_state(_state(session), after)
    assert len(session.generated) <= 3


def test_the_context_caps_the_number_of_new_tokens(real, scratch):
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=50))
    session.model = copy.copy(scratch)
    session.model.cfg = copy.copy(scratch.cfg)
    session.model.cfg.max_position_embeddings = 12
    results = session.generate(list(range(200, 210)))  # 10 tokens of a 12-token context: room for 2
    assert len(results) == 2 and results[-1].stop_reason == "length" and session.cache.max_len == 12


def test_constructor_refuses_bad_values(real, scratch):
    with pytest.raises(CourseError, match="params must be a SamplingParams"):
        GenerationSession(scratch, real.tokenizer, {"max_tokens": 0})
    with pytest.raises(CourseError, match="attention"):
        GenerationSession(scratch, real.tokenizer, attention=(0, 9))
    with pytest.raises(CourseError, match="stop strings"):
        GenerationSession(scratch, real.tokenizer, SamplingParams(stop=["\n"]))
    default = GenerationSession(scratch, real.tokenizer)
    assert default.params == SamplingParams(stop_token_ids=(2,))  # temperature 1; the end-of-turn ids stop it
    assert GenerationSession(scratch, real.tokenizer, SamplingParams(stop_token_ids=[7])).params.stop_token_ids == (7,)


def test_the_stepper_benchmark_prints_its_figures(real, capsys):
    import json

    from llm_anatomy.cli.bench.stepper import main

    assert main(["--steps", "2", "--json", "--device", "cpu", "--prompt", "Name three colours."]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["steps"] == 2 and figures["prefill_ms"] > 0 and figures["step_click_median_ms"] > 0
    assert figures["step_click_median_ms"] >= figures["step_model_median_ms"] and figures["target_step_ms"] == 150.0


def test_a_repetition_penalty_in_the_session_gives_transformers_tokens(real, scratch, greedy_reference):
    from llm_anatomy.generate.penalties import Penalties

    ids = real.tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, repetition_penalty=1.5,
                                                                                    max_tokens=12))
    session.generate(ids)
    want = greedy_reference(ids, 12, repetition_penalty=1.5)
    assert session.generated == want[:len(session.generated)]
    plain = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=12))
    plain.generate(ids)
    assert plain.generated != session.generated  # the penalty changed the greedy text: the test can tell


def test_min_p_and_penalties_resample_without_a_model_call_and_bad_ones_change_nothing(real, scratch, monkeypatch):
    from llm_anatomy.generate.penalties import Penalties

    session = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=8))
    session.prefill("the the the the", chat=False)
    greedy = session.generated[-1]
    calls = []
    original = scratch.trace
    monkeypatch.setattr(scratch, "trace", lambda *a, **k: calls.append(1) or original(*a, **k))
    banned = session.resample(penalties=Penalties(repetition=1e6))  # every seen token pushed far down
    assert banned.token_id not in session.prompt_ids and session.params.repetition_penalty == 1e6
    back = session.resample(penalties=Penalties())
    assert back.token_id == greedy
    one = session.resample(temperature=1.0, min_p=1.0)  # only tokens as likely as the best one
    assert one.token_id == greedy and one.prob == 1.0 and session.params.min_p == 1.0
    before = _state(session)
    for bad in (dict(min_p=1.5), dict(penalties=Penalties), dict(penalties=0.5)):
        with pytest.raises(CourseError):
            session.resample(**bad)
        assert _same_state(_state(session), before)
    with pytest.raises(CourseError, match="frequency_penalty"):
        session.set_settings(penalties=Penalties(frequency=-9))
    assert calls == [] and _same_state(_state(session), before)


def test_the_session_and_a_served_request_stop_by_the_same_rule(real, scratch):
    """generate/stops.finish_reason decides for both: a greedy session and the same prompt as a Request served by the
    continuous scheduler, with the same params, end with the same tokens and the same reason (the session says "eos"
    for "stop"); a stop id chosen from the greedy answer cuts both at the same place."""
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.serve.scheduler import ContinuousScheduler

    ids = real.tokenizer("One, two, three, four, five,")["input_ids"]
    free = GenerationSession(scratch, real.tokenizer, SamplingParams(0.0, max_tokens=6))
    free.generate(ids, chat=False)
    params = SamplingParams(0.0, max_tokens=6, stop_token_ids=[free.generated[3]])
    for p, reason in ((params, "stop"), (SamplingParams(0.0, max_tokens=6, stop_token_ids=[10 ** 5]), "length")):
        session = GenerationSession(scratch, real.tokenizer, p)
        session.generate(ids, chat=False)
        pool = PagedKVPool.for_model(scratch, 16, 16)
        served = ContinuousScheduler(scratch, pool, max_batch=1).run([Request(ids, params=p)])[0]
        assert served.output == session.generated and served.finish_reason == reason
        assert session.last.stop_reason == {"stop": "eos", "length": "length"}[reason]
        if reason == "stop":
            assert len(served.output) <= 4 and served.output[-1] == free.generated[3]  # cut at the stop id
    assert served.output == free.generated and len(served.output) == 6
