"""Statistics the course's checks need: Pearson's chi-squared test of samples against a distribution.

Notebook 09 uses it to show that speculative sampling keeps the model's distribution (claim C18): samples that
follow `probs` give a p-value that is rarely small; a wrong rule gives one far below 0.001.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError


@dataclass
class ChiSquared:
    """The result of chi_squared_test."""

    statistic: float
    dof: int
    p_value: float  # the chance of a statistic at least this large if the samples do follow the distribution


def chi_squared_test(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> ChiSquared:
    """Pearson's chi-squared test of token samples [n] against a distribution [vocab].

    Tokens expected fewer than `min_expected` times are pooled into one bin, as the test requires.
    """
    n, probs = samples.numel(), probs.double().cpu()
    counts = torch.bincount(samples.reshape(-1).cpu(), minlength=probs.numel()).double()
    expected = probs * n
    big = expected >= min_expected
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().view(1)])
    if wanted[-1] < min_expected:  # too little left over for a bin of its own: fold it into the others' total
        observed, wanted = observed[:-1], wanted[:-1]
        observed[-1] += counts[~big].sum()
        wanted[-1] += expected[~big].sum()
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    dof = observed.numel() - 1
    if dof < 1:
        raise CourseError("The test needs at least two bins: draw more samples, or use a less certain distribution.")
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return ChiSquared(statistic, dof, p_value)
