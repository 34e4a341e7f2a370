"""Speculative decoding (speculative.py): greedy tokens identical to plain decoding and to transformers'
prompt-lookup generation; the accept-or-resample rule keeps the model's distribution, even with a bad draft."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.errors import CourseError
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.fast.speculative import (LayerSkipDraft, PromptLookupDraft, accept_or_resample,
                                          expected_tokens_per_round, predicted_speedup, speculative_generate)
from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.measure.stats import chi_squared_test
from llm_anatomy.weights.random import random_llama


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def tiny():
    return ScratchLlama.from_hf(random_llama(seed=3, tie_word_embeddings=False))


class ScriptedDraft:
    """A draft that proposes given tokens (right or wrong), to steer the loop through every case."""

    def __init__(self, proposals):
        self.proposals, self.valid = list(proposals), []

    def draft(self, context, k, params=None, generator=None):
        return (self.proposals.pop(0) if self.proposals else [])[:k], None

    def rollback(self, valid):
        self.valid.append(valid)


# --------------------------------------------------------------------------- drafts


def test_prompt_lookup_copies_what_followed_the_latest_match():
    draft = PromptLookupDraft(max_ngram=2)
    assert draft.draft([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3], 3) == ([5, 6, 2], None)  # "2 3" last seen before "5 6"
    assert draft.draft([7, 8, 9], 2) == ([], None)  # nothing repeats: no draft
    assert draft.draft([4, 5, 4], 4) == ([5, 4], None)  # a 1-gram match, cut at the end of the context
    with pytest.raises(CourseError, match="min_ngram"):
        PromptLookupDraft(max_ngram=1, min_ngram=2)


def test_layer_skip_draft_with_every_layer_is_the_model(tiny):
    ids = torch.tensor([[5, 9, 17, 4]])
    plain = generate_greedy(tiny, ids, 6).tokens[0].tolist()
    assert LayerSkipDraft(tiny, range(tiny.cfg.num_layers)).draft(ids[0].tolist(), 6)[0] == plain
    early = LayerSkipDraft(tiny, [0])
    assert early.model.layers[0] is tiny.layers[0] and early.model.lm_head is tiny.lm_head  # shared, not copied
    with pytest.raises(CourseError, match="keep"):
        LayerSkipDraft(tiny, [0, 7])


# --------------------------------------------------------------------------- greedy: identical tokens


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_gives_the_plain_tokens_whatever_the_draft(tiny, k):
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    plain = generate_greedy(tiny, ids, 30).tokens[0].tolist()
    for draft in (PromptLookupDraft(), LayerSkipDraft(tiny, [0]), LayerSkipDraft(tiny, [0, 1])):
        result = speculative_generate(tiny, ids, 30, draft, k)
        assert result.tokens == plain
        assert result.rounds <= 29 and result.accepted <= result.drafted
    perfect = speculative_generate(tiny, ids, 30, LayerSkipDraft(tiny, [0, 1]), k)
    assert perfect.acceptance_rate == 1.0 and perfect.rounds == -(-29 // (k + 1))  # k + 1 tokens per round


def test_rejected_drafts_are_rolled_back(tiny):
    ids = torch.tensor([[5, 9, 17, 4]])
    plain = generate_greedy(tiny, ids, 8).tokens[0].tolist()
    wrong = [(t + 1) % 128 for t in plain]
    draft = ScriptedDraft([[plain[1], plain[2], wrong[3]], [wrong[4]], [], plain[6:8]])
    result = speculative_generate(tiny, ids, 8, draft, k=3)
    assert result.tokens == plain
    # the last round has room for one draft only: its own token makes the eighth
    assert result.accepted_per_round == [2, 0, 0, 1] and result.rejections == 2 and result.drafted == 5
    assert draft.valid == [0, 4 + 1 + 2, 4 + 4 + 0, 4 + 5 + 0, 4 + 6 + 1]  # a new sequence, then context + kept
    assert result.acceptance_rate == 3 / 5 and result.tokens_per_round == 7 / 4
    assert result.rounds_without_draft == 1  # the third round's draft proposed nothing
    assert 0 < result.prefill_s <= result.seconds


def test_eos_stops_and_bad_input_is_refused(tiny):
    ids = torch.tensor([[5, 9, 17, 4]])
    plain = generate_greedy(tiny, ids, 10).tokens[0].tolist()
    result = speculative_generate(tiny, ids, 10, PromptLookupDraft(), 4, eos_token_id=plain[3])
    assert result.tokens == plain[:plain.index(plain[3]) + 1]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CourseError, match="draft length"):
            speculative_generate(tiny, ids, 4, PromptLookupDraft(), bad)
    with pytest.raises(CourseError, match="one sequence"):
        speculative_generate(tiny, ids.expand(2, -1), 4, PromptLookupDraft(), 2)
    with pytest.raises(CourseError, match="new_tokens"):
        speculative_generate(tiny, ids, 0, PromptLookupDraft(), 2)
    room = tiny.cfg.max_position_embeddings - ids.shape[1]
    with pytest.raises(CourseError, match=f"context of {tiny.cfg.max_position_embeddings} positions.*at most {room}"):
        speculative_generate(tiny, ids, room + 1, PromptLookupDraft(), 2)


class _TooLongDraft(PromptLookupDraft):
    def draft(self, context, k, params=None, generator=None):
        return [5] * (k + 3), None  # more tokens than asked for


def test_a_draft_longer_than_asked_is_refused(tiny):
    ids = torch.tensor([[5, 9, 17, 4]])
    with pytest.raises(CourseError, match="proposed 7 tokens when asked for at most 4"):
        speculative_generate(tiny, ids, 10, _TooLongDraft(), 4)


def test_real_prompt_lookup_equals_transformers_and_plain_decoding(real, real_scratch):
    """transformers' own prompt-lookup generation, ours and plain greedy decoding: the same tokens."""
    from llm_anatomy.generate.chat import chat_prompt_ids
    from llm_anatomy.texts import python_topic

    model = real_scratch
    text = python_topic("assignment")[:500]
    prompt = chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "Repeat this text exactly:\n\n" + text}])
    n = 24
    plain = generate_greedy(model, prompt, n).tokens[0].tolist()
    ours = speculative_generate(model, prompt, n, PromptLookupDraft(max_ngram=2), 6)
    with torch.inference_mode():
        theirs = real.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, prompt_lookup_num_tokens=6, pad_token_id=0)[0, prompt.shape[1]:]
    assert ours.tokens == plain == theirs.tolist()
    assert ours.acceptance_rate > 0.5 and ours.tokens_per_round > 2  # the answer copies the prompt


# --------------------------------------------------------------------------- sampling: the same distribution


def _distributions():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(40, generator=g) * 2, dim=-1)  # the model's
    near = torch.softmax(torch.log(p) + 0.3 * torch.randn(40, generator=g), dim=-1)  # a good draft
    bad = torch.softmax(-torch.log(p), dim=-1)  # a deliberately bad one: likes what the model dislikes
    return p, near, bad


@pytest.mark.parametrize("which", ["near", "bad", "one-hot"])
def test_accept_or_resample_keeps_the_target_distribution(which):
    p, near, bad = _distributions()
    g = torch.Generator().manual_seed(1)
    q = {"near": near, "bad": bad, "one-hot": torch.nn.functional.one_hot(torch.tensor(7), 40).float()}[which]
    drafts = torch.multinomial(q, 40_000, replacement=True, generator=g)
    accepted, tokens = accept_or_resample(p, q, drafts, g)
    assert chi_squared_test(tokens, p).p_value > 1e-3
    expected_acceptance = torch.minimum(p, q).sum().item()  # P(accept) = sum_x min(p(x), q(x))
    assert abs(accepted.double().mean().item() - expected_acceptance) < 0.01
    if which == "bad":
        assert expected_acceptance < 0.3  # a bad draft is mostly rejected: slow, but still exact


def test_the_test_catches_a_wrong_rule():
    """Resampling from p itself (instead of max(p - q, 0)) skews the result towards q: the test sees it."""
    p, _, bad = _distributions()
    g = torch.Generator().manual_seed(2)
    drafts = torch.multinomial(bad, 40_000, replacement=True, generator=g)
    accepted = torch.rand(40_000, generator=g) * bad[drafts] < p[drafts]
    wrong = torch.where(accepted, drafts, torch.multinomial(p, 40_000, replacement=True, generator=g))
    assert chi_squared_test(wrong, p).p_value < 1e-6


def test_sampling_speculation_matches_the_models_distribution_end_to_end(tiny):
    """The second generated token's distribution, over 1,500 speculative runs with a one-layer draft, equals the
    model's own: sum over the first token x of p(x) * p(y | x), computed exactly."""
    ids = torch.tensor([[5, 9, 17, 4]])
    t = 1.5
    with torch.no_grad():
        first = torch.softmax(tiny(ids)[0, -1] / t, dim=-1)  # [vocab]
        both = torch.cat([ids.expand(128, -1), torch.arange(128)[:, None]], dim=1)  # every first token
        second = torch.softmax(tiny(both)[:, -1] / t, dim=-1)  # [vocab, vocab]: p(y | x)
    marginal = first @ second  # [vocab]
    g = torch.Generator().manual_seed(0)
    draft = LayerSkipDraft(tiny, [1])
    # 3 new tokens: the prefill gives the first, so the round after it drafts one (with 2 it would have no room)
    samples = torch.tensor([speculative_generate(tiny, ids, 3, draft, 1, params=SamplingParams(t), generator=g).tokens[1]
                            for _ in range(1500)])
    assert chi_squared_test(samples, marginal).p_value > 1e-3


def test_sampling_goes_through_the_course_sampler(tiny):
    """top-k, top-p and min-p reach the draft and the verify pass: top_k=1 leaves one token to draw, the greedy one,
    and so does min_p=1 (only tokens as likely as the best)."""
    ids = torch.tensor([[5, 9, 17, 4]])
    plain = generate_greedy(tiny, ids, 12).tokens[0].tolist()
    g = torch.Generator().manual_seed(0)
    for draft in (LayerSkipDraft(tiny, [0]), PromptLookupDraft()):
        for one in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)):
            params = SamplingParams(temperature=1.5, **one)
            assert speculative_generate(tiny, ids, 12, draft, 3, params=params, generator=g).tokens == plain
    assert speculative_generate(tiny, ids, 12, PromptLookupDraft(), 3, params=SamplingParams(1.5), generator=g
                                ).tokens != plain  # without a filter it samples: the test can tell
    with pytest.raises(CourseError, match="SamplingParams"):
        speculative_generate(tiny, ids, 4, PromptLookupDraft(), 2, params={"temperature": 1.0})
    with pytest.raises(TypeError):  # the keyword arguments of before are gone: one SamplingParams
        speculative_generate(tiny, ids, 4, PromptLookupDraft(), 2, temperature=1.0)


def test_penalties_give_the_session_rule_greedy_tokens(tiny):
    """Greedy with penalties keeps the drafts the penalized model would choose: the tokens of plain greedy decoding
    with the same penalties, token by token, whichever draft; and the penalties change them (the test can tell)."""
    from llm_anatomy.generate.sampling import sample_next

    ids = torch.tensor([[5, 9, 17, 4, 5, 9, 17, 4]])
    params = SamplingParams(temperature=0.0, repetition_penalty=1.8, presence_penalty=0.5, frequency_penalty=0.3)
    context, plain = ids[0].tolist(), []
    with torch.no_grad():
        for _ in range(16):  # plain decoding: the whole sequence each time, the penalties by the one sampler
            logits = tiny(torch.tensor([context + plain]))[0, -1]
            plain.append(int(sample_next(logits, params, prompt=context, output=plain)[0]))
    for draft in (PromptLookupDraft(), LayerSkipDraft(tiny, [0]), LayerSkipDraft(tiny, [0, 1])):
        assert speculative_generate(tiny, ids, 16, draft, 3, params=params).tokens == plain
    assert generate_greedy(tiny, ids, 16).tokens[0].tolist() != plain


def test_logits_that_hold_nan_are_refused(tiny, monkeypatch):
    ids = torch.tensor([[5, 9, 17, 4]])
    monkeypatch.setattr(tiny.norm, "forward", lambda x: torch.full_like(x, float("nan")))
    for t in (0.0, 1.0):
        with pytest.raises(CourseError, match="NaN"):
            speculative_generate(tiny, ids, 4, PromptLookupDraft(), 2, params=SamplingParams(t))


def test_expected_tokens_and_predicted_speedup():
    assert expected_tokens_per_round(0.0, 4) == 1 and expected_tokens_per_round(1.0, 4) == 5
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    assert predicted_speedup(0.5, 2, verify_cost=1.25) == pytest.approx(1.4)
    assert predicted_speedup(0.8, 4, verify_cost=1.2, draft_cost=0.2) == pytest.approx(3.3616 / 2.0)
    with pytest.raises(CourseError, match="between 0 and 1"):
        expected_tokens_per_round(1.5, 3)


def test_the_cost_model_prices_each_round_at_its_own_width():
    from llm_anatomy.fast.speculative import (SpeculativeResult, best_draft_length, leviathan_speedup,
                                              predicted_from_widths)

    run = SpeculativeResult(tokens=list(range(1 + 3 + 1 + 5)), rounds=3, drafted_per_round=[4, 0, 4],
                            accepted_per_round=[2, 0, 4])  # 3 + 1 + 5 new tokens after the first
    # widths 5, 1 and 5: costs 1.5, 1.0 and 1.5 decode steps (1.5 interpolated between widths 3 and 9)
    assert predicted_from_widths(run, [1, 3, 9], [1.0, 1.25, 2.0]) == pytest.approx(9 / 4.0)
    with pytest.raises(CourseError, match="increasing widths"):
        predicted_from_widths(run, [3, 1], [1.0, 1.2])
    assert leviathan_speedup(0.0, 4, 0.0) == 1.0  # nothing accepted, free draft: plain speed
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.4))
    assert best_draft_length(0.9, 0.01) > best_draft_length(0.9, 0.3) >= best_draft_length(0.5, 0.3)
    with pytest.raises(CourseError, match="cost c"):
        leviathan_speedup(0.5, 2, -1)


def test_the_best_draft_length_takes_the_measured_pass_costs():
    from llm_anatomy.fast.speculative import best_draft_length, leviathan_speedup

    # a free draft, almost always accepted: with every pass at one step, the longest draft wins
    assert best_draft_length(0.95, 0.0) == 16
    # the same passes priced as measured, a pass over n tokens costing about n / 4 steps past 4 tokens: shorter wins
    widths, costs = [1, 3, 5, 9, 17], [1.0, 1.1, 1.4, 2.4, 4.4]
    best = best_draft_length(0.95, 0.0, widths=widths, pass_costs=costs)
    assert best < 16
    assert leviathan_speedup(0.95, best, 0.0, float(np.interp(best + 1, widths, costs))) > leviathan_speedup(
        0.95, 16, 0.0, 4.4)
    # flat measured costs give Leviathan's answer back; k stops at the widest pass timed (no extrapolation)
    assert best_draft_length(0.95, 0.0, widths=[1, 17], pass_costs=[1.0, 1.0]) == 16
    assert best_draft_length(0.95, 0.0, widths=[1, 9], pass_costs=[1.0, 1.0]) == 8
    # a pass over n tokens costing n steps (compute-bound): a draft never pays more than its first token
    assert best_draft_length(0.95, 0.0, widths=[1, 17], pass_costs=[1.0, 17.0]) == 1
    with pytest.raises(CourseError, match="increasing widths from 1"):
        best_draft_length(0.9, 0.0, widths=[3, 9], pass_costs=[1.0, 2.0])
    with pytest.raises(CourseError, match="increasing widths from 1"):
        best_draft_length(0.9, 0.0, widths=[1, 9], pass_costs=None)


# --------------------------------------------------------------------------- C18's checks in false worlds


def _keep_every_draft(logits, drafts, q, params, generator, prompt, output):
    """A verifier that accepts every draft token, whatever the model says: the next token comes after them."""
    return len(drafts), int(logits[len(drafts)].argmax())


def test_the_greedy_check_holds_for_the_real_loop(tiny):
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.speculative import same_greedy_tokens

    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    plain = generate_greedy(tiny, ids, 30).tokens[0].tolist()
    runs = {"prompt lookup": speculative_generate(tiny, ids, 30, PromptLookupDraft(), 8).tokens,
            "skip": speculative_generate(tiny, ids, 30, LayerSkipDraft(tiny, [0]), 2).tokens}
    claim("C18", *same_greedy_tokens(plain, runs))


@pytest.mark.counterfactual("C18", "a greedy verifier that keeps every draft token, whatever the model chose")
def test_the_greedy_check_fails_when_the_verifier_keeps_every_draft(tiny, monkeypatch):
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast import speculative
    from llm_anatomy.fast.speculative import same_greedy_tokens

    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    plain = generate_greedy(tiny, ids, 30).tokens[0].tolist()
    monkeypatch.setattr(speculative, "_verify", _keep_every_draft)
    skip = speculative_generate(tiny, ids, 30, LayerSkipDraft(tiny, [0]), 2).tokens
    with pytest.raises(ClaimFailed, match="C18 FAILED.*differ"):
        claim("C18", *same_greedy_tokens(plain, {"skip": skip}))


def test_the_rule_check_holds_for_leviathans_rule():
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.sampling_check import rule_check

    p, near, bad = _distributions()
    claim("C18", rule_check(p, {"near": near, "bad": bad}, generator=torch.Generator().manual_seed(0)).holds, "")


@pytest.mark.counterfactual("C18", "a sampling verifier that accepts every draft token: the tokens follow the draft")
def test_the_rule_check_fails_when_every_draft_is_accepted():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.sampling_check import rule_check

    p, near, bad = _distributions()
    accept_all = lambda p, q, drafts, generator=None: (torch.ones_like(drafts, dtype=torch.bool), drafts)  # noqa: E731
    found = rule_check(p, {"near": near, "bad": bad}, generator=torch.Generator().manual_seed(0), rule=accept_all)
    assert found.tests["bad"].p_value < 1e-6
    with pytest.raises(ClaimFailed, match="C18 FAILED"):
        claim("C18", found.holds, found.evidence())


@pytest.mark.counterfactual("C18", "a rule that resamples a rejected draft from p instead of max(p - q, 0)")
def test_the_rule_check_fails_when_rejections_resample_from_p():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.sampling_check import _resample_from_p, rule_check

    p, near, bad = _distributions()
    found = rule_check(p, {"near": near, "bad": bad}, generator=torch.Generator().manual_seed(0), rule=_resample_from_p)
    with pytest.raises(ClaimFailed, match="C18 FAILED"):
        claim("C18", found.holds, found.evidence())


def _never_keep(logits, drafts, q, params, generator, prompt, output):
    """A greedy verifier that keeps no draft: the model's own token every round, plain decoding at one pass a token."""
    return 0, int(logits[0].argmax())


REPEATING = torch.tensor([[5, 9, 17, 4, 5, 9, 17, 4, 5, 9, 17, 4]])  # prompt lookup finds drafts; the tiny model keeps them


def _lookup_evidence(model):
    from llm_anatomy.fast.speculative import counted_passes, greedy_speculation_evidence

    plain = generate_greedy(model, REPEATING, 20).tokens[0].tolist()
    run, passes = counted_passes(model, lambda: speculative_generate(model, REPEATING, 20, PromptLookupDraft(), 8))
    return plain, run, passes, greedy_speculation_evidence


def test_greedy_prompt_lookup_takes_fewer_passes_than_tokens():
    from llm_anatomy.claims import claim

    model = ScratchLlama.from_hf(random_llama("tiny", "cpu", seed=3))
    plain, run, passes, evidence = _lookup_evidence(model)
    assert passes == 1 + run.rounds and run.rounds < len(run.tokens) - 1  # measured: 11 passes for 20 tokens
    claim("C18", *evidence(plain, {"prompt lookup": run.tokens}, run, passes))


@pytest.mark.counterfactual("C18", "a greedy verifier that never keeps a draft (plain decoding, one pass a token)")
def test_the_greedy_check_fails_when_the_verifier_keeps_no_draft(monkeypatch):
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast import speculative

    model = ScratchLlama.from_hf(random_llama("tiny", "cpu", seed=3))
    monkeypatch.setattr(speculative, "_verify", _never_keep)
    plain, run, passes, evidence = _lookup_evidence(model)
    assert run.tokens[:len(plain)] == plain  # the tokens are right: only the pass count tells
    with pytest.raises(ClaimFailed, match="C18 FAILED.*not fewer"):  # measured: 20 passes for 20 tokens
        claim("C18", *evidence(plain, {"prompt lookup": run.tokens}, run, passes))


@pytest.mark.counterfactual("C18", "drafts verified one pass each instead of together in one pass a round")
def test_the_greedy_check_fails_when_each_draft_takes_its_own_pass():
    from llm_anatomy.claims import ClaimFailed, claim

    model = ScratchLlama.from_hf(random_llama("tiny", "cpu", seed=3))
    plain, run, passes, evidence = _lookup_evidence(model)
    with pytest.raises(ClaimFailed, match="C18 FAILED.*did not"):  # a pass per drafted token on top of each round's
        claim("C18", *evidence(plain, {"prompt lookup": run.tokens}, run, passes + run.drafted))


@pytest.mark.counterfactual("C18", "a sampling rule that never keeps a draft and draws every token from p")
def test_the_rule_check_fails_when_no_draft_is_ever_kept():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.sampling_check import rule_check

    p, near, bad = _distributions()

    def never_keeps(p, q, drafts, generator=None):  # its tokens follow p exactly: only the acceptance tells
        return torch.zeros(drafts.shape, dtype=torch.bool), torch.multinomial(p, drafts.numel(), True, generator=generator)
    found = rule_check(p, {"near": near, "bad": bad}, generator=torch.Generator().manual_seed(0), rule=never_keeps)
    assert all(t.p_value > 1e-3 for t in found.tests.values())
    with pytest.raises(ClaimFailed, match="C18 FAILED"):
        claim("C18", found.holds, found.evidence())


@pytest.mark.counterfactual("C18", "a sampling rule that keeps too many drafts (min(1, 2 p / q))")
def test_the_rule_check_fails_when_drafts_are_kept_too_often():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.sampling_check import rule_check

    p, near, bad = _distributions()

    found = rule_check(p, {"near": near, "bad": bad}, generator=torch.Generator().manual_seed(0), rule=_keep_twice)
    with pytest.raises(ClaimFailed, match="C18 FAILED"):
        claim("C18", found.holds, found.evidence())


def _keep_twice(p, q, drafts, generator=None):
    """Keep x with probability min(1, 2 p(x) / q(x)), else draw from max(p - q, 0): too many drafts kept."""
    u = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    accepted = u * q.double()[drafts] < 2 * p.double()[drafts]
    residual = (p - q).clamp(min=0).double()
    resampled = torch.multinomial(residual / residual.sum(), drafts.numel(), True, generator=generator)
    return accepted, torch.where(accepted, drafts, resampled)


def test_the_params_stop_ids_end_it_and_what_it_cannot_honour_is_refused(tiny):
    ids = torch.tensor([[5, 9, 17, 4]])
    plain = generate_greedy(tiny, ids, 10).tokens[0].tolist()
    params = SamplingParams(0.0, stop_token_ids=[plain[3]])
    cut = speculative_generate(tiny, ids, 10, PromptLookupDraft(), 4, params=params).tokens
    assert cut == plain[:plain.index(plain[3]) + 1] and len(cut) < len(plain)  # as eos_token_id=plain[3] does
    for bad in (dict(stop=["x"]), dict(top_logprobs=2)):
        with pytest.raises(CourseError, match="stop strings and top_logprobs"):
            speculative_generate(tiny, ids, 4, PromptLookupDraft(), 2, params=SamplingParams(0.0, **bad))


def test_batched_speculation_speedup_follows_the_roofline():
    from llm_anatomy.fast.speculative import (batched_speculation_speedup, expected_tokens_per_round,
                                              first_losing_batch)
    e = expected_tokens_per_round(0.61, 4)  # 2.34 tokens a round
    assert batched_speculation_speedup(0.61, 4, 1, 6) == pytest.approx(e)  # 5 rows, below the ridge: one step
    assert batched_speculation_speedup(0.61, 4, 2, 6) == pytest.approx(e / (10 / 6))  # plain still memory-bound
    assert batched_speculation_speedup(0.61, 4, 100, 6) == pytest.approx(e / 5)  # both compute-bound: k + 1 steps
    assert first_losing_batch(0.61, 4, 6) == 3  # 15 rows: 2.5 steps for 2.34 tokens
    assert first_losing_batch(0.99, 1, 6) == 6  # E = 1.99: loses only once the plain step is compute-bound too
    assert first_losing_batch(1.0, 4, 6) is None  # every draft kept: E = k + 1, never below the pass's cost
    with pytest.raises(CourseError):
        batched_speculation_speedup(0.5, 4, 0, 6)
