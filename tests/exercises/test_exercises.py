import torch

from llm_anatomy.exercises import Verdict, exercise, expect, forbidden, hint, hints, reset_hints


@exercise
def check_double(answer):
    expect(callable(answer), "give a function")
    expect(answer(2) == 4, f"double(2) should be 4, got {answer(2)!r}")
    return "doubling works"


def test_a_right_answer_passes():
    verdict = check_double(lambda x: 2 * x)
    assert verdict.passed and bool(verdict)
    assert str(verdict) == "Correct! doubling works"
    assert "Correct!" in verdict._repr_html_()


def test_a_wrong_answer_gets_the_hint():
    verdict = check_double(lambda x: x + 1)
    assert not verdict.passed
    assert str(verdict) == "Not yet: double(2) should be 4, got 3"
    assert "#b00020" in verdict._repr_html_()


def test_an_unattempted_exercise_does_not_raise():
    def double(x):
        raise NotImplementedError

    verdict = check_double(double)
    assert isinstance(verdict, Verdict) and not verdict.passed
    assert "not attempted:" in verdict.message and "yet" not in verdict.message


def test_a_crash_in_the_learners_code_is_named_not_raised():
    verdict = check_double(lambda x: 1 / 0)
    assert not verdict.passed and "ZeroDivisionError" in verdict.message


def test_html_is_escaped():
    verdict = check_double(lambda x: "<b>")
    assert "&lt;b&gt;" in verdict._repr_html_()


@exercise
@hints("think of what doubling means", "it is x + x, or 2 * x", "def double(x): return ...")
def check_hinted(answer):
    expect(answer(3) == 6, "double(3) should be 6")
    return "ok"


def test_hints_come_one_at_a_time_then_stay():
    reset_hints()
    first = hint(check_hinted)
    assert first.shown == ("think of what doubling means",) and "Hint 1 of 3" in str(first)
    assert "hint 2 of 3" in first._repr_html_()
    assert hint(check_hinted).shown[-1] == "it is x + x, or 2 * x"
    last = hint(check_hinted)
    assert len(last.shown) == 3 and "last hint" in str(last)
    assert len(hint(check_hinted).shown) == 3  # no fourth
    reset_hints()
    assert len(hint(check_hinted).shown) == 1


@exercise
def check_softmax_by_hand(answer):
    x = torch.tensor([1.0, 2.0, 3.0])
    with forbidden(torch, "softmax", "compute it from exp and a sum"):
        got = answer(x)
    expect(torch.allclose(got, torch.softmax(x, -1)), "not the softmax")
    return "by hand"


def test_a_forbidden_shortcut_is_refused_and_restored():
    assert not check_softmax_by_hand(lambda x: torch.softmax(x, -1)).passed
    assert "don't call torch.softmax" in check_softmax_by_hand(lambda x: torch.softmax(x, -1)).message
    assert check_softmax_by_hand(lambda x: x.exp() / x.exp().sum()).passed
    assert torch.softmax(torch.zeros(2), -1).tolist() == [0.5, 0.5]  # restored afterwards
