"""Pearson's chi-squared test (measure/stats.py) on counts worked out by hand."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.errors import CourseError
from llm_anatomy.measure.stats import chi_squared_test


def test_chi_squared_on_known_counts():
    samples = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    result = chi_squared_test(samples, torch.tensor([0.5, 0.3, 0.2]))
    assert result.statistic == pytest.approx(0, abs=1e-9) and result.dof == 2 and result.p_value == pytest.approx(1.0)
    skewed = chi_squared_test(torch.tensor([0] * 80 + [1] * 10 + [2] * 10), torch.tensor([0.5, 0.3, 0.2]))
    assert skewed.statistic == pytest.approx(18 + 40 / 3 + 5) and skewed.p_value < 1e-6  # e^(-x/2) for 2 dof
    assert skewed.p_value == pytest.approx(torch.exp(torch.tensor(-skewed.statistic / 2)).item(), rel=1e-6)


def test_rare_tokens_are_pooled_into_one_bin():
    probs = torch.tensor([0.5, 0.44, 0.04, 0.02])  # 100 samples: the last two expect 4 and 2, pooled into 6
    samples = torch.tensor([0] * 50 + [1] * 44 + [2] * 4 + [3] * 2)
    result = chi_squared_test(samples, probs)
    assert result.dof == 2 and result.statistic == pytest.approx(0, abs=1e-9)
    with pytest.raises(CourseError, match="two bins"):
        chi_squared_test(torch.zeros(10, dtype=torch.long), torch.tensor([1.0, 0.0]))
