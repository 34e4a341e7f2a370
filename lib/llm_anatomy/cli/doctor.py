"""`python -m llm_anatomy doctor`: the environment check, printed, with exit status 1 when something must be fixed."""

from __future__ import annotations

from ..measure.environment import environment_report, format_report, problems_in


def main(argv: list[str] | None = None) -> int:
    report = environment_report()
    print(format_report(report))
    return 1 if problems_in(report) else 0
