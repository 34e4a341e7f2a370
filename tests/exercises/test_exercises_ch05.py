"""Notebook 05's checks: the solutions pass, typical mistakes get a helpful hint."""

from __future__ import annotations

import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch05

solutions = load_solutions("ch05")


def test_the_solutions_pass():
    for verdict in (ch05.check_next_probs(solutions.next_probs), ch05.check_top_p(solutions.keep_top_p),
                    ch05.check_min_p(solutions.keep_min_p)):
        assert verdict.passed, verdict.message


def test_the_next_probs_solution_matches_transformers_warpers_on_the_checks_cases():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    for logits, t, k in ch05._choice_cases():
        if t == 0:
            assert int(solutions.next_probs(logits, t, k).argmax()) == int(logits.argmax())
            continue
        scores = TemperatureLogitsWarper(t)(None, logits[None].clone())
        scores = TopKLogitsWarper(k)(None, scores) if k else scores
        torch.testing.assert_close(solutions.next_probs(logits, t, k), torch.softmax(scores[0], -1))
    assert any(len(set(logits.tolist())) < logits.numel() and k for logits, _, k in ch05._choice_cases())  # ties


def test_unattempted_exercises_say_not_yet():
    def todo(*args):
        raise NotImplementedError

    for check in (ch05.check_next_probs, ch05.check_top_p, ch05.check_min_p):
        verdict = check(todo)
        assert not verdict.passed and "not attempted" in verdict.message
    assert "define" in ch05.check_next_probs(None).message


def _cut(logits, t, keep):
    return torch.softmax((logits / t).masked_fill(~keep, float("-inf")), -1)


def _top(logits, k):
    return torch.zeros_like(logits, dtype=torch.bool).scatter(0, torch.topk(logits, k).indices, True)


def test_next_probs_mistakes_are_named():
    def with_greedy(wrong):  # the mistake at temperature > 0; greedy done right, so the mistake is what is seen
        return lambda l, t, k: solutions.next_probs(l, t, k) if t == 0 else wrong(l, t, k)

    drops_ties = with_greedy(lambda l, t, k: _cut(l, t, _top(l, k)) if k else torch.softmax(l / t, -1))
    multiplies = with_greedy(lambda l, t, k: solutions.next_probs(l * t * t, t, k))
    no_top_k = with_greedy(lambda l, t, k: torch.softmax(l / t, -1))
    least = with_greedy(lambda l, t, k: _cut(l, t, _top(-l, k)) if k else torch.softmax(l / t, -1))
    no_softmax = with_greedy(lambda l, t, k: l / t)
    ignores_t = with_greedy(lambda l, t, k: solutions.next_probs(l, 1.0, k))
    not_yet(ch05.check_next_probs(drops_ties), "tie for the top", "keep EVERY token")
    not_yet(ch05.check_next_probs(multiplies), "multiplied the logits by the temperature")
    not_yet(ch05.check_next_probs(no_top_k), "you kept every token")
    not_yet(ch05.check_next_probs(least), "LEAST likely")
    not_yet(ch05.check_next_probs(no_softmax), "not 1", "softmax")
    not_yet(ch05.check_next_probs(ignores_t), "ignore the temperature")


def test_next_probs_greedy_mistakes_are_named():
    def divides_by_zero(l, t, k):
        return torch.softmax(l / t, -1) if t == 0 else solutions.next_probs(l, t, k)

    def argmin(l, t, k):
        return torch.nn.functional.one_hot(l.argmin(), l.numel()).float() if t == 0 else solutions.next_probs(l, t, k)

    not_yet(ch05.check_next_probs(divides_by_zero), "temperature 0", "do not divide")
    not_yet(ch05.check_next_probs(argmin), "LEAST likely")
    not_yet(ch05.check_next_probs(lambda l, t, k: torch.ones(3)), "shape")


def test_next_probs_shortcuts_are_refused():
    from transformers.generation.logits_process import TopKLogitsWarper

    from llm_anatomy.generate import sampling

    not_yet(ch05.check_next_probs(lambda l, t, k: sampling.next_token_probs(l, t, k)), "next_token_probs")
    top_k_mask = sampling.top_k_mask  # an alias bound before the check runs is refused too

    def through_the_mask(l, t, k):
        if t == 0 or not k:
            return solutions.next_probs(l, t, k)
        return _cut(l, t, top_k_mask(l / t, k))

    not_yet(ch05.check_next_probs(through_the_mask), "top_k_mask")

    def warped(l, t, k):
        if t == 0 or not k:
            return solutions.next_probs(l, t, k)
        return torch.softmax(TopKLogitsWarper(k)(None, (l / t)[None])[0], -1)

    not_yet(ch05.check_next_probs(warped), "TopKLogitsWarper")


def test_top_p_solution_matches_transformers_warper_on_the_checks_cases():
    from transformers.generation.logits_process import TopPLogitsWarper

    for logits, p in ch05._top_p_cases():
        warped = TopPLogitsWarper(p)(None, logits[None].clone())[0]
        assert solutions.keep_top_p(logits, p) == set(torch.isfinite(warped).nonzero().flatten().tolist())
    assert ch05.check_top_p(solutions.keep_top_p).passed


def _sorted_parts(logits):
    probs = torch.softmax(logits, -1)
    ordered, order = probs.sort(descending=True)
    return probs, ordered, order


def test_top_p_mistakes():
    def stops_short(logits, p):  # keeps tokens while the running sum stays at or below p
        probs, ordered, order = _sorted_parts(logits)
        return set(order[ordered.cumsum(0) <= p].tolist()) or {int(order[0])}

    def unsorted(logits, p):
        probs = torch.softmax(logits, -1)
        return set(torch.nonzero(probs.cumsum(0) - probs < p).flatten().tolist())

    def dropped(logits, p):
        return set(range(logits.numel())) - solutions.keep_top_p(logits, p)

    def ascending(logits, p):
        probs = torch.softmax(logits, -1)
        ordered, order = probs.sort()
        return set(order[ordered.cumsum(0) - ordered < p].tolist())

    def on_logits(logits, p):  # the cumulative sum of logits, not of probabilities
        ordered, order = logits.sort(descending=True)
        return set(order[ordered.cumsum(0) - ordered < p].tolist())

    not_yet(ch05.check_top_p(stops_short), "one token short", "brings the sum to p")
    not_yet(ch05.check_top_p(unsorted), "vocabulary order")
    not_yet(ch05.check_top_p(dropped), "DROPS")
    not_yet(ch05.check_top_p(ascending), "most likely")
    not_yet(ch05.check_top_p(on_logits), "softmax")
    not_yet(ch05.check_top_p(lambda l, p: set()), "no token")
    not_yet(ch05.check_top_p(lambda l, p: "0"), "as a set")
    not_yet(ch05.check_top_p(unattempted), "not attempted")


def test_the_loop_solution_passes_and_the_library_loop_is_refused():
    assert ch05.check_generate_until_stop(solutions.generate_until_stop).passed

    def library_loop(model, ids, n, stop_ids):
        from llm_anatomy.generate.decode import generate_greedy

        return generate_greedy(model, ids, n).tokens[0].tolist(), "length"

    not_yet(ch05.check_generate_until_stop(library_loop), "the loop is the exercise")


def test_loop_mistakes():
    def never_appends(model, ids, n, stop_ids):
        return [int(model(ids)[0, -1].argmax()) for _ in range(n)], "length"

    def first_position(model, ids, n, stop_ids):
        new = []
        for _ in range(n):
            nxt = model(ids)[0, 0].argmax()
            new.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        return new, "length"

    def ignores_stop(model, ids, n, stop_ids):
        return solutions.generate_until_stop(model, ids, n, stop_ids=set())

    def drops_stop(model, ids, n, stop_ids):
        out, reason = solutions.generate_until_stop(model, ids, n, stop_ids)
        return (out[:-1], reason) if reason == "stop" else (out, reason)

    def one_short(model, ids, n, stop_ids):
        return solutions.generate_until_stop(model, ids, n - 1, stop_ids)

    def no_reason(model, ids, n, stop_ids):
        return solutions.generate_until_stop(model, ids, n, stop_ids)[0]

    def wrong_reason(model, ids, n, stop_ids):
        return solutions.generate_until_stop(model, ids, n, stop_ids)[0], "eos"

    not_yet(ch05.check_generate_until_stop(never_appends), "append")
    not_yet(ch05.check_generate_until_stop(first_position), "LAST position")
    not_yet(ch05.check_generate_until_stop(ignores_stop), "went on after the stop")
    not_yet(ch05.check_generate_until_stop(drops_stop), "keep the stop token")
    not_yet(ch05.check_generate_until_stop(one_short), "exactly max_new_tokens")
    not_yet(ch05.check_generate_until_stop(no_reason), "two things")
    not_yet(ch05.check_generate_until_stop(wrong_reason), "the reason should be")
    not_yet(ch05.check_generate_until_stop(unattempted), "not attempted")


def test_min_p_solution_passes_and_typical_mistakes_are_named():
    assert ch05.check_min_p(solutions.keep_min_p).passed
    absolute = lambda l, m: set(torch.nonzero(torch.softmax(l, -1) >= m).flatten().tolist())  # noqa: E731
    assert "scales the threshold" in ch05.check_min_p(absolute).message
    on_logits = lambda l, m: set(torch.nonzero(l >= m * l.max()).flatten().tolist())  # noqa: E731
    assert "compared the logits" in ch05.check_min_p(on_logits).message
    strict = lambda l, m: set(torch.nonzero(torch.softmax(l, -1) > m * torch.softmax(l, -1).max()).flatten().tolist())  # noqa: E731
    assert "exactly on the threshold" in ch05.check_min_p(strict).message
    assert "kept" in ch05.check_min_p(lambda l, m: {int(l.argmax())}).message


def test_min_p_shortcuts_through_the_library_are_refused():
    from llm_anatomy.generate.sampling import min_p_mask, next_token_probs

    verdict = ch05.check_min_p(lambda l, m: set(min_p_mask(l, m).nonzero().flatten().tolist()))
    assert not verdict.passed and "min_p_mask" in verdict.message
    verdict = ch05.check_min_p(lambda l, m: set((next_token_probs(l, min_p=m) > 0).nonzero().flatten().tolist()))
    assert not verdict.passed and "next_token_probs" in verdict.message
    assert "not attempted" in ch05.check_min_p(lambda l, m: (_ for _ in ()).throw(NotImplementedError)).message
