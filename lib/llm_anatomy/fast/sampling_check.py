"""Claim C18's end-to-end evidence: the tokens that speculative *sampling* gives follow the model's own distribution.

Notebook 09 tests the accept-or-resample rule at one position (fast/speculative.accept_or_resample). This checks the
whole loop, `speculative_generate`, where drafting, verifying, rolling back and the bonus token all take part: the
second generated token, over many runs, must follow the model's own marginal

    P(second = y) = sum over x of p(x | prompt) * p(y | prompt, x),

computed exactly by running the model once over the prompt followed by every possible first token (so only for a
small vocabulary: a tiny random model). The negative control is what a loop that kept every draft would give, the
first token from the model and the second from the draft: the samples must follow the model's marginal and not that
one, which shows that the test can tell the two apart at this number of draws. Probabilities [vocab] on the CPU; p-values from measure/stats.py's chi-squared test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError
from ..generate.sampling import SamplingParams
from ..measure.stats import ChiSquared, chi_squared_test
from .speculative import speculative_generate


@torch.inference_mode()
def second_token_marginal(model, prompt_ids: torch.Tensor, temperature: float, second_model=None) -> torch.Tensor:
    """The exact distribution [vocab] of the second token sampled at `temperature` after prompt_ids [1, seq]:
    sum over x of p(x | prompt) * p'(y | prompt, x), with p from `model` and p' from `second_model` (default: the
    same model; the draft's gives what a loop that kept every draft would sample)."""
    vocab = model.cfg.vocab_size
    if vocab > 4096:
        raise CourseError(f"The exact marginal runs the model over every first token: {vocab:,} of them is too many "
                          "here; use a small model (weights.random.random_llama).")
    first = torch.softmax(model(prompt_ids)[0, -1].float() / temperature, dim=-1)  # [vocab]
    every = torch.arange(vocab, device=prompt_ids.device)[:, None]  # [vocab, 1]: each possible first token
    both = torch.cat([prompt_ids.expand(vocab, -1), every], dim=1)  # [vocab, seq + 1]
    second = torch.softmax((second_model or model)(both)[:, -1].float() / temperature, dim=-1)  # [vocab, vocab]
    return (first @ second).cpu()  # second[x, y] = p'(y | prompt, x)


@dataclass
class EndToEnd:
    """What end_to_end_sampling found: tests of the samples against the model's marginal and the keep-every-draft one."""

    draws: int
    against_model: ChiSquared
    against_draft: ChiSquared
    acceptance: float  # the share of drafted tokens kept, over all runs

    @property
    def holds(self) -> bool:
        """The samples pass against the model (p > 0.001) and fail against the draft (p < 0.001)."""
        return self.against_model.p_value > 1e-3 and self.against_draft.p_value < 1e-3

    def evidence(self) -> str:
        return (f"the second token of {self.draws} speculative samples against the model's exact marginal: p-value "
                f"{self.against_model.p_value:.2f}; against what keeping every draft would give: "
                f"{self.against_draft.p_value:.0e} (the test tells them apart); {self.acceptance:.0%} of the drafts kept")


def end_to_end_sampling(model, prompt_ids: torch.Tensor, draft, draws: int = 400, k: int = 2,
                        temperature: float = 1.5, seed: int = 0) -> EndToEnd:
    """Run speculative_generate `draws` times and test the second token (the first draft, kept or resampled) against
    both marginals.

    draft: a LayerSkipDraft (its `.model` gives the draft's own marginal).
    """
    if draws < 50:
        raise CourseError(f"A chi-squared test needs many draws: at least 50, not {draws}.")
    g = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    params = SamplingParams(temperature=temperature)  # no filter: the marginals above are the plain softmax's
    seconds, kept, drafted = [], 0, 0
    for _ in range(draws):
        # k + 2 new tokens: the prefill gives the first, so the round after it has room for all k drafts (with 2, none)
        run = speculative_generate(model, prompt_ids, k + 2, draft, k, params=params, generator=g)
        seconds.append(run.tokens[1])
        kept, drafted = kept + run.accepted, drafted + run.drafted
    samples = torch.tensor(seconds)  # [draws]
    return EndToEnd(draws, chi_squared_test(samples, second_token_marginal(model, prompt_ids, temperature)),
                    chi_squared_test(samples, second_token_marginal(model, prompt_ids, temperature, draft.model)),
                    kept / drafted if drafted else 0.0)


# --------------------------------------------------------------------------- the rule at one position (notebook 09)


def _resample_from_p(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator=None):
    """A wrong rule, the control: keep x with probability min(1, p(x) / q(x)), else draw from p itself (not from
    max(p - q, 0)). Its tokens lean towards q."""
    u = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    accepted = u * q.double()[drafts] < p.double()[drafts]
    return accepted, torch.where(accepted, drafts, torch.multinomial(p, drafts.numel(), True, generator=generator))


@dataclass
class RuleCheck:
    """What rule_check found: a chi-squared test against p of the tokens each draft gave, and of the control's."""

    tests: dict[str, ChiSquared]
    acceptance: dict[str, float]
    control: ChiSquared  # the wrong rule (resample from p) on the last draft: the test must catch it
    expected: dict[str, float] = None  # each draft's acceptance by theory, sum over x of min(p(x), q(x))
    draws: int = 0

    def acceptance_off(self, name: str) -> float:
        """How many standard errors draft `name`'s measured acceptance lies from sum min(p, q) (one draw's error
        at least: a rate of exactly 0 or 1 has none)."""
        a = self.expected[name]
        se = max((a * (1 - a) / self.draws) ** 0.5, 1 / self.draws)
        return abs(self.acceptance[name] - a) / se

    @property
    def holds(self) -> bool:
        """Every draft's tokens pass (p > 0.001), each draft is kept as often as the rule says (within
        ACCEPTANCE_SE standard errors of sum min(p, q): a rule that never keeps a draft, drawing every token from p,
        passes the first test and fails this one), and the wrong rule's tokens fail (p < 1e-6): the test can tell."""
        return (all(t.p_value > 1e-3 for t in self.tests.values()) and self.control.p_value < 1e-6
                and all(self.acceptance_off(name) <= ACCEPTANCE_SE for name in self.tests))

    def evidence(self) -> str:
        return ("with good and bad drafts the samples follow the model's distribution (p-values "
                + ", ".join(f"{name} {t.p_value:.2g}" for name, t in self.tests.items())
                + "; each must be above 0.001); each draft kept as often as sum min(p, q) says ("
                + ", ".join(f"{self.acceptance[n]:.3f} against {self.expected[n]:.3f}, {self.acceptance_off(n):.1f} "
                            "standard errors" for n in self.tests)
                + f"; bar {ACCEPTANCE_SE}); the wrong rule is caught ({self.control.p_value:.0e}, below 1e-6)")


# How far a draft's measured acceptance may lie from sum min(p, q), in standard errors of `draws` Bernoulli trials.
# Under the true rule the deviation is a standard normal: 5 is passed once in about 1.7 million checks. A rule that
# never keeps a draft lies 0.9 / 0.002 = hundreds of standard errors off at 20,000 draws (the notebook's int8 draft).
ACCEPTANCE_SE = 5.0


def rule_check(p: torch.Tensor, drafts_q: dict[str, torch.Tensor], draws: int = 20_000, generator=None,
               rule=None) -> RuleCheck:
    """C18 at one position: draw `draws` tokens from each draft's distribution q, pass them through `rule`
    (default: speculative.accept_or_resample, Leviathan's), and test the tokens that come out against p. The
    control runs the wrong rule (resample from p) on the last draft (put the bad one last). p and each q: [vocab]."""
    from . import speculative

    rule = rule or speculative.accept_or_resample
    tests, acceptance, expected = {}, {}, {}
    for name, q in drafts_q.items():
        accepted, tokens = rule(p, q, torch.multinomial(q, draws, replacement=True, generator=generator), generator)
        tests[name], acceptance[name] = chi_squared_test(tokens, p), float(accepted.float().mean())
        expected[name] = float(torch.minimum(p.double(), q.double()).sum())  # P(keep) = sum_x q(x) min(1, p(x)/q(x))
    last = list(drafts_q.values())[-1]
    drafts = torch.multinomial(last, draws, replacement=True, generator=generator)
    _, wrong = _resample_from_p(p, last, drafts, generator)
    return RuleCheck(tests, acceptance, chi_squared_test(wrong, p), expected, draws)
