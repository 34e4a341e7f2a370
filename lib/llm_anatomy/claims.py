"""Claims held to their evidence: a cell that demonstrates a claim also checks it.

    claim("C8", torch.equal(cached, uncached), f"{n} tokens, identical: {torch.equal(cached, uncached)}")

returns one line, a verdict with the evidence, that the notebook shows (as a cell's last expression, or through
display(...)), and raises ClaimFailed when the evidence does not hold, so that
the notebook run (and CI, which runs every notebook) fails instead of printing "identical: False" beside prose
that says the opposite. Use `claim` only for what must hold on any machine: exactness, identical tokens in
fp32, bytes equal to a formula, a speedup that the world without the mechanism cannot reach. What depends on the
hardware (how close to a roof) is not a claim to assert: `reading` prints the measurement for the prose to quote.
Where this machine cannot separate a claim from its counterfactual (no GPU, fewer free cores than ranks),
`not_shown` says so, why, and what would show it, in a colour of its own: never a green "holds".

Every claim has counterfactual worlds (a plausible bug, an engine without the mechanism) in which its check raises
ClaimFailed; tests/counterfactuals/ runs each one, and tests/test_counterfactuals.py fails for a claim without one.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

CLAIM_ID = re.compile(r"^C\d{1,2}$")
GREEN, BLUE, RED = "#1b7f3b", "#1f4e79", "#b00020"  # holds / a reading / not yet
AMBER = "#8a5a00"  # not shown on this machine (it lacks what would separate the claim from its counterfactual)


class ClaimFailed(AssertionError):
    """The evidence shown by a cell does not support the claim it demonstrates."""


@dataclass(frozen=True, repr=False)
class Verdict:
    """One line that a notebook shows in colour: what `claim`, `reading` and every exercise check return.

    mark: the line's opening words ("\u2714 C8 holds:", "Correct!", "Not yet:"); message: the rest; passed: False
    only for an exercise answer that is not right yet (a claim that fails raises instead); name: the exercise
    check that gave it, if any.
    """

    mark: str
    message: str
    colour: str
    passed: bool = True
    name: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{self.mark} {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return (f'<div style="border-left:4px solid {self.colour};padding:2px 8px;color:{self.colour}">'
                f"<b>{html.escape(self.mark)}</b> {html.escape(self.message)}</div>")


def _checked_id(claim_id) -> str:
    if not isinstance(claim_id, str) or not CLAIM_ID.match(claim_id):
        raise ValueError(f"claim_id must be 'C' and a number, such as 'C8', not {claim_id!r}.")
    return claim_id


def claim(claim_id: str, holds, evidence: str) -> Verdict:
    """Check a claim on its evidence: a green line when `holds` is true, else ClaimFailed with the evidence.

    claim_id: "C1" .. "C26" (the course's table of claims); holds: the check itself (a bool, or a tensor
    or number that is truthy); evidence: the measured figures, in a sentence.
    """
    _checked_id(claim_id)
    ok = bool(holds)
    if not ok:
        raise ClaimFailed(f"{claim_id} FAILED on this machine: {evidence}")
    return Verdict(f"\u2714 {claim_id} holds:", evidence, GREEN)


def reading(claim_id: str, text: str) -> Verdict:
    """A measurement that depends on the hardware, printed for the prose to read (never asserted)."""
    return Verdict(f"\u25b8 {_checked_id(claim_id)} on this machine:", text, BLUE)


def not_shown(claim_id: str, why: str, would_show: str) -> Verdict:
    """This machine cannot separate the claim from its counterfactual: say so, why, and what would show it.

    Never raises and never prints "holds": an amber line that the book counts apart from the claims that hold.
    why: what this machine lacks ("no GPU: a CPU has no tensor-core roof to reach"); would_show: the machine or
    setting that would ("a CUDA GPU: run this notebook in Colab").
    """
    if not why or not would_show:
        raise ValueError("not_shown needs both why this machine cannot show the claim and what would show it.")
    return Verdict(f"\u25cc {_checked_id(claim_id)} not shown on this machine:", f"{why}. What would show it: {would_show}",
                   AMBER)
