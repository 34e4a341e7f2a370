"""Notebook 12's checks: the solutions pass on patterns and vocabularies the notebook never shows (and on the real
tokenizer's tokens); each typical mistake and each shortcut is refused with the sentence that names it."""

from __future__ import annotations

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.constrained import DEAD
from llm_anatomy.exercises import ch12

solutions = load_solutions("ch12")


def _mask(dfa, state, vocab, eos_id, *, read=lambda data: data, eos=None, special=False, walk_on=False):
    """The solution's mask with one mistake planted: `read` cuts each token's bytes, `eos(state)` decides EOS,
    special=True allows None, walk_on=True reads dfa.table without stopping at DEAD."""
    mask = []
    for data in vocab:
        if data is None:
            mask.append(special and state != DEAD)
            continue
        s = state
        for byte in read(data):
            s = dfa.table[s][byte] if walk_on else dfa.step(s, byte)
            if s == DEAD and not walk_on:
                break
        mask.append(state != DEAD and s != DEAD)
    mask[eos_id] = (eos or (lambda st: st != DEAD and dfa.accepting[st]))(state)
    return mask


def test_the_solutions_pass():
    for verdict in (ch12.check_token_mask(solutions.token_mask), ch12.check_advance(solutions.advance)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    for check in (ch12.check_token_mask, ch12.check_advance):
        assert "not attempted" in check(unattempted).message
        not_yet(check(None), "define")


def test_token_mask_mistakes():
    check = ch12.check_token_mask
    not_yet(check(lambda *a: _mask(*a, read=lambda d: d[:1])), "only each token's first byte")
    not_yet(check(lambda *a: _mask(*a, read=lambda d: d[:-1])), "skipped each token's last byte")
    not_yet(check(lambda *a: _mask(*a, eos=lambda st: st != DEAD)), "end-of-sequence token too early")
    not_yet(check(lambda *a: _mask(*a, eos=lambda st: False)), "never allow the end-of-sequence token")
    not_yet(check(lambda *a: _mask(*a, special=True)), "special token", "never allowed")
    not_yet(check(lambda *a: _mask(*a, walk_on=True)), "went on after a byte led to DEAD", "table[-1]")
    not_yet(check(lambda dfa, state, vocab, eos: [i for i, ok in enumerate(solutions.token_mask(dfa, state, vocab, eos))
                                                  if ok]), "one boolean per token id")

    def walks_none(dfa, state, vocab, eos_id):
        return [all(dfa.step(state, b) != DEAD for b in data) for data in vocab]

    not_yet(check(walks_none), "None for each special token")

    def no_dead_case(dfa, state, vocab, eos_id):  # the solution without its DEAD case: EOS read from accepting[-1]
        mask = [data is not None and solutions.advance(dfa, state, data) != DEAD for data in vocab]
        mask[eos_id] = bool(dfa.accepting[state])
        return mask

    not_yet(check(no_dead_case), "from DEAD nothing is allowed", "accepting[-1]")


def test_the_courses_masks_are_refused_however_they_are_reached():
    from llm_anatomy.constrained import TokenMasker, naive_mask

    not_yet(ch12.check_token_mask(naive_mask), "don't call", "naive_mask")
    not_yet(ch12.check_token_mask(lambda dfa, s, vocab, eos, f=naive_mask: f(dfa, vocab, s, eos)), "don't call")
    not_yet(ch12.check_token_mask(lambda dfa, s, vocab, eos: TokenMasker(dfa, vocab, eos).allowed(s)), "don't call",
            "TokenMasker")


def test_advance_mistakes():
    check = ch12.check_advance

    def walk(dfa, state, data, stop_at_dead=True, keep_last_alive=False):
        for byte in data:
            nxt = dfa.table[state][byte] if not stop_at_dead else dfa.step(state, byte)
            if nxt == DEAD and keep_last_alive:
                return state
            state = nxt
        return state

    not_yet(check(lambda dfa, state, data: state), "the state it started from")
    not_yet(check(lambda dfa, state, data: dfa.start), "advance it")
    not_yet(check(lambda dfa, state, data: solutions.advance(dfa, state, data[:1])), "only the token's first byte")
    not_yet(check(lambda dfa, state, data: solutions.advance(dfa, state, data[:-1])), "skipped the token's last byte")
    not_yet(check(lambda dfa, state, data: walk(dfa, state, data, stop_at_dead=False) if state != DEAD else DEAD),
            "went on after a byte led to DEAD", "table[-1]")
    not_yet(check(lambda dfa, state, data: walk(dfa, state, data, keep_last_alive=True) if state != DEAD else DEAD),
            "return DEAD (-1)")
    not_yet(check(lambda dfa, state, data: None if solutions.advance(dfa, state, data) == DEAD else
                  solutions.advance(dfa, state, data)), "returned None", "DEAD (-1)")
    not_yet(check(lambda dfa, state, data: walk(dfa, state, data) if state != DEAD else dfa.start), "from DEAD")


def test_the_automatons_own_walk_is_refused():
    not_yet(ch12.check_advance(lambda dfa, state, data: dfa.walk(state, data)), "don't call", "walk")


def walk_trace(dfa, state, data: bytes) -> list[int]:
    """Notebook 12's walk (section 2), in the learner's namespace as this module's globals stand for it here."""
    states = [state]
    for byte in data:
        states.append(dfa.step(states[-1], byte))
        if states[-1] == DEAD:
            break
    return states


def test_the_notebooks_walk_trace_is_refused():
    not_yet(ch12.check_advance(lambda dfa, state, data: walk_trace(dfa, state, data)[-1]), "don't call", "walk_trace")
    not_yet(ch12.check_token_mask(lambda dfa, state, vocab, eos: [
        data is not None and state != DEAD and walk_trace(dfa, state, data)[-1] != DEAD for data in vocab]),
        "don't call", "walk_trace")
