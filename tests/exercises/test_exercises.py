from llm_anatomy.exercises import Verdict, exercise, expect


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
    assert "not attempted yet" in verdict.message


def test_a_crash_in_the_learners_code_is_named_not_raised():
    verdict = check_double(lambda x: 1 / 0)
    assert not verdict.passed and "ZeroDivisionError" in verdict.message


def test_html_is_escaped():
    verdict = check_double(lambda x: "<b>")
    assert "&lt;b&gt;" in verdict._repr_html_()
