"""Every claim can fail: the table of counterfactual worlds, one or more per claim of README's table.

A counterfactual is a test marked `@pytest.mark.counterfactual("C8", "decode positions shifted by +3")`: a plausible
bug or an engine without the mechanism, in which the claim's own check (the library function or the notebook cell
that the notebook runs) must raise ClaimFailed. This file fails when a claim of README's table has no counterfactual,
when a marked test never expects ClaimFailed, and when tests/COUNTERFACTUALS.md (the table a reader looks at) is
not the table the tests hold. Rewrite that table with:

    python tests/test_counterfactuals.py --write
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TABLE = TESTS / "COUNTERFACTUALS.md"


@dataclass(frozen=True)
class Counterfactual:
    claim_id: str
    world: str
    test: str  # path::function
    expects_claim_failed: bool


def readme_claim_ids(readme: Path = ROOT / "README.md") -> list[str]:
    """The ids of README's table of claims, in order (C1 .. C25)."""
    return re.findall(r"^\|\s*(C\d{1,2})\s*\|", readme.read_text(encoding="utf-8"), re.M)


def _mark(decorator: ast.expr) -> tuple[str, str] | None:
    """("C8", "world") for `@pytest.mark.counterfactual("C8", "world")`, else None."""
    if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.counterfactual"):
        return None
    args = [a.value for a in decorator.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(args) != 2:
        raise ValueError(f"counterfactual marks take a claim id and a world, as strings: {ast.unparse(decorator)}")
    return args[0], args[1]


def _expects_claim_failed(function: ast.AST) -> bool:
    """True when the function's body has `pytest.raises(ClaimFailed ...)` (alone or in a tuple)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.raises" and node.args:
            if "ClaimFailed" in ast.unparse(node.args[0]):
                return True
    return False


def counterfactuals_in(source: str, name: str) -> list[Counterfactual]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                marked = _mark(decorator)
                if marked:
                    found.append(Counterfactual(marked[0], marked[1], f"{name}::{node.name}",
                                                _expects_claim_failed(node)))
    return found


def all_counterfactuals() -> list[Counterfactual]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        found += counterfactuals_in(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return sorted(found, key=lambda c: (int(c.claim_id[1:]), c.test))


def table(found: list[Counterfactual]) -> str:
    lines = ["# Counterfactual worlds, one or more per claim", "",
             "In each world the claim is false, and the claim's own check (the code its notebook cell calls) raises",
             "ClaimFailed; on the real course it holds. Made by `python tests/test_counterfactuals.py --write` from",
             "the tests marked `@pytest.mark.counterfactual`; tests/test_counterfactuals.py fails when it is stale.", "",
             "| claim | the world where it is false | test |", "|---|---|---|"]
    lines += [f"| {c.claim_id} | {c.world} | `{c.test}` |" for c in found]
    return "\n".join(lines) + "\n"


def test_every_claim_has_a_counterfactual():
    claims, found = readme_claim_ids(), all_counterfactuals()
    assert len(claims) >= 25
    missing = [cid for cid in claims if cid not in {c.claim_id for c in found}]
    assert not missing, f"claims with no counterfactual world: {', '.join(missing)}"
    unknown = sorted({c.claim_id for c in found} - set(claims))
    assert not unknown, f"counterfactuals for claims README does not list: {unknown}"


def test_every_counterfactual_expects_claim_failed():
    lax = [c.test for c in all_counterfactuals() if not c.expects_claim_failed]
    assert not lax, f"marked counterfactual but never expects ClaimFailed (pytest.raises(ClaimFailed)): {lax}"


def test_the_table_a_reader_sees_is_the_tests_table():
    assert TABLE.read_text(encoding="utf-8") == table(all_counterfactuals()), (
        "tests/COUNTERFACTUALS.md is stale: python tests/test_counterfactuals.py --write")


def test_the_scan_finds_marks_and_lax_tests():
    source = '''
import pytest
@pytest.mark.counterfactual("C8", "positions shifted")
def test_a():
    with pytest.raises(ClaimFailed, match="C8 FAILED"):
        check()
@pytest.mark.counterfactual("C9", "no mask")
def test_b():
    with pytest.raises(AssertionError):
        check()
@pytest.mark.integration
def test_c():
    pass
'''
    assert counterfactuals_in(source, "t.py") == [Counterfactual("C8", "positions shifted", "t.py::test_a", True),
                                                   Counterfactual("C9", "no mask", "t.py::test_b", False)]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        TABLE.write_text(table(all_counterfactuals()), encoding="utf-8")
        print(f"wrote {TABLE.relative_to(ROOT)}")
    else:
        print(table(all_counterfactuals()))
