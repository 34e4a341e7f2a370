"""The exercise machinery: verdicts, hints, the returned-value helper and the alias-proof shortcut guard."""

import functools
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llm_anatomy.claims import Verdict as ClaimVerdict
from llm_anatomy.exercises import (NotYet, Verdict, call, exercise, expect, forbidden, forbidden_all, hint, hints,
                                   reset_hints, returned)
from llm_anatomy.model import attention as attention_module
from llm_anatomy.tokens import bpe


@exercise
def check_double(answer):
    expect(callable(answer), "give a function")
    got = call(answer, 2)
    expect(got == 4, f"double(2) should be 4, got {got!r}")
    return "doubling works"


def test_one_verdict_class_for_claims_and_exercises():
    assert Verdict is ClaimVerdict


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
    assert not verdict.passed and "your code raised ZeroDivisionError" in verdict.message


def test_a_check_that_cannot_use_the_answer_asks_for_what_it_wants():
    @exercise
    def check_length(answer):
        return f"{len(call(answer))} long"

    verdict = check_length(lambda: 5)
    assert not verdict.passed and "your code raised" not in verdict.message and "could not use your answer" in \
        verdict.message


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


# --------------------------------------------------------------------------- returned(): the learner's result


def _why(value, kind, what="the answer"):
    with pytest.raises(NotYet) as refused:
        returned(value, kind, what)
    return str(refused.value)


def test_returned_accepts_near_miss_types_that_mean_the_same():
    assert returned(np.int64(65), "whole") == 65 and type(returned(np.int64(65), "whole")) is int
    assert returned(65.0, "whole") == 65  # from // on floats
    assert returned(torch.tensor(3), "id") == 3 and returned(np.int64(3), "id") == 3
    assert returned(torch.tensor([2.5]), "number") == 2.5 and returned(np.float32(0.5), "number") == 0.5
    assert returned(torch.tensor([[1, 2], [3, 4]]), "ids") == [1, 2, 3, 4]
    assert returned((1, np.int64(2)), "ids") == [1, 2]
    assert returned(torch.tensor([3, 1, 3]), "id set") == {1, 3}
    assert torch.equal(returned([1.0, 2.0], "tensor"), torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert returned([1, 2], "pair") == (1, 2)


def test_returned_says_what_to_return():
    assert "None" in _why(None, "number", "the loss") and "return" in _why(None, "number", "the loss")
    assert "a number" in _why("1.5", "number") and "str" in _why("1.5", "number")
    assert "whole number" in _why(65.5, "whole")
    assert "an int" in _why(3.0, "id") and "int(...)" in _why(3.0, "id")
    assert "not a finite number" in _why(float("nan"), "number")
    assert "a number" in _why(True, "number")  # a bool is no number here
    assert "list of ints" in _why("abc", "ids")
    assert "as a tensor" in _why("0.5", "tensor")
    assert "two things" in _why([1, 2, 3], "pair", "(the ids, the reason)")
    assert "a string" in _why(7, "text")


# --------------------------------------------------------------------------- forbidden(): the shortcut guard


@exercise
def check_softmax_by_hand(answer):
    x = torch.tensor([1.0, 2.0, 3.0])
    with forbidden_all([(torch, "softmax"), (torch.Tensor, "softmax"), (F, "softmax")], "compute it from exp and a "
                                                                                          "sum"):
        got = call(answer, x)
    expect(torch.allclose(got, torch.softmax(x, -1)), "not the softmax")
    return "by hand"


def test_a_forbidden_shortcut_is_refused_and_restored():
    assert not check_softmax_by_hand(lambda x: torch.softmax(x, -1)).passed
    assert "don't call torch.softmax" in check_softmax_by_hand(lambda x: torch.softmax(x, -1)).message
    assert check_softmax_by_hand(lambda x: x.exp() / x.exp().sum()).passed
    assert torch.softmax(torch.zeros(2), -1).tolist() == [0.5, 0.5]  # restored afterwards
    assert "softmax" not in vars(torch.Tensor) and torch.Tensor.softmax is torch._C.TensorBase.softmax
    assert sys.getprofile() is None


softmax_bound_before = torch.softmax  # a name an earlier cell bound, as `from torch import softmax` does


@pytest.mark.parametrize("shortcut", [
    pytest.param(lambda x: softmax_bound_before(x, -1), id="a-name-bound-before"),
    pytest.param(lambda x: x.softmax(-1), id="a-tensor-method"),
    pytest.param(lambda x: torch.Tensor.softmax(x, -1), id="the-method-from-its-class"),
    pytest.param(lambda x: F.softmax(x, -1), id="functional"),
    pytest.param(lambda x, f=torch.softmax: f(x, -1), id="a-default-argument"),
    pytest.param(lambda x: {"f": torch.softmax}["f"](x, -1), id="from-a-dict"),
    pytest.param(lambda x: functools.partial(torch.softmax, dim=-1)(x), id="a-partial-called-from-C"),
    pytest.param(lambda x: list(map(lambda row: row.softmax(-1), [x]))[0], id="inside-map"),
])
def test_the_guard_refuses_the_object_however_it_was_reached(shortcut):
    verdict = check_softmax_by_hand(shortcut)
    assert not verdict.passed and "don't call" in verdict.message and "softmax" in verdict.message, verdict


def test_a_closure_and_a_nested_helper_are_refused_too():
    def make():
        f = torch.softmax

        def helper(x):
            return f(x, -1)

        return lambda x: helper(x)

    assert "don't call" in check_softmax_by_hand(make()).message


def test_a_refusal_the_learners_code_swallows_still_refuses():
    def swallowing(x):
        try:
            return torch.softmax(x, -1)
        except Exception:
            return x.exp() / x.exp().sum()

    assert "don't call torch.softmax" in check_softmax_by_hand(swallowing).message


def test_python_functions_are_refused_by_their_code_whatever_imported_them():
    from llm_anatomy.tokens.bpe_train import train_fast  # the notebook's own import, bound before the check

    with pytest.raises(NotYet, match="don't call tokens.bpe_train.train_fast"):
        with forbidden(sys.modules["llm_anatomy.tokens.bpe_train"], "train_fast", "write the loop"):
            train_fast("abab", 257)
    with pytest.raises(NotYet, match="BPETokenizer.train"):
        with forbidden(bpe.BPETokenizer, "train", "write the loop"):
            bpe.BPETokenizer.train("abab", 257)
    assert bpe.BPETokenizer.train("abab", 257).merges == {(97, 98): 256}  # a classmethod, restored as one
    from llm_anatomy.model.attention import repeat_kv

    with pytest.raises(NotYet, match="repeat_kv"):
        with forbidden(attention_module, "repeat_kv", "share the heads yourself"):
            repeat_kv(torch.ones(1, 1, 2, 2), 3)


def test_a_class_is_refused_by_every_method_it_defines():
    with pytest.raises(NotYet, match="CrossEntropyLoss"):
        with forbidden_all([torch.nn.CrossEntropyLoss], "use log_softmax"):
            torch.nn.CrossEntropyLoss()(torch.zeros(1, 2), torch.tensor([0]))
    assert torch.nn.CrossEntropyLoss()(torch.zeros(1, 2), torch.tensor([0])) > 0


def test_when_narrows_the_refusal_to_some_calls():
    def scale(x, factor):
        return x * factor

    with forbidden_all([scale], "not by ten", when=lambda arguments: arguments["factor"] == 10):
        assert scale(2, 3) == 6
    with pytest.raises(NotYet, match="not by ten"):
        with forbidden_all([scale], "not by ten", when=lambda arguments: arguments["factor"] == 10):
            scale(2, 10)


def test_nested_guards_both_watch_and_the_profiler_comes_back():
    before = sys.getprofile()
    with pytest.raises(NotYet, match="torch.softmax"):
        with forbidden(torch, "softmax", "a"):
            with forbidden(torch, "tanh", "b"):
                assert torch.tanh is not torch._C._VariableFunctions.tanh
                softmax_bound_before(torch.ones(2), -1)  # the outer guard's object, seen inside the inner one
    assert sys.getprofile() is before and torch.tanh is torch._C._VariableFunctions.tanh
    with pytest.raises(NotYet, match="torch.tanh"):
        with forbidden(torch, "softmax", "a"):
            with forbidden(torch, "tanh", "b"):
                pass
            torch.tanh(torch.zeros(1))  # the inner guard is closed: tanh is allowed again
            raise NotYet("don't call torch.tanh: this line shows the call above passed")
    assert sys.getprofile() is before


def test_a_swallowed_refusal_refuses_when_the_guard_closes():
    with pytest.raises(NotYet, match="torch.softmax"):
        with forbidden(torch, "softmax", "a"):
            try:
                softmax_bound_before(torch.ones(2), -1)
            except NotYet:
                pass


def test_an_owner_of_none_is_skipped_and_a_missing_name_is_a_bug():
    with forbidden_all([(None, "anything")], "x"):
        pass
    with pytest.raises(AttributeError):
        forbidden(torch, "no_such_function", "x")
