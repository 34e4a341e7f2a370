"""The packed step's time split (issue 51): its parts are real, add up to the step, and its ops are counted."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.measure.step_parts import step_split


@pytest.fixture
def packed_step(tiny_model):
    from llm_anatomy.fast.packed import kernel_status, one_step, pack
    from llm_anatomy.model.scratch import ScratchLlama

    plain = ScratchLlama.from_hf(tiny_model)
    fmt = "int4" if kernel_status("int4")[0] and plain.cfg.hidden_size % 32 == 0 else "int8"
    try:
        model = pack(plain, fmt)
    except Exception:  # noqa: BLE001  a tiny model int4's group does not divide: int8 has the same parts
        model = pack(plain, "int8")
    with torch.inference_mode():
        yield one_step(model, torch.tensor([[5, 6, 7, 8]]))


def test_the_split_parts_are_positive_and_add_up_to_the_step(packed_step):
    with torch.inference_mode():
        split = step_split(packed_step, steps=3)
    for name in ("matmuls", "casts", "attention", "other_ops", "between_ops", "rest", "step_s"):
        assert isinstance(split[name], float) and split[name] > 0, (name, split[name])
    parts = split["matmuls"] + split["casts"] + split["attention"] + split["rest"]
    # the spans (the profiler's clock) against the wall time (perf_counter, around the calls): within 15%, never more
    assert split["step_s"] * 0.85 < parts <= split["step_s"] * 1.001
    assert isinstance(split["ops"], int) and split["ops"] > 0
    assert sum(split["fractions"].values()) == pytest.approx(1.0)


def test_a_step_that_calls_no_op_is_refused():
    from llm_anatomy.errors import CourseError

    with pytest.raises(CourseError, match="no aten ops"):
        step_split(lambda: None, steps=2)
