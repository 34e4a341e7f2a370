"""tools/gpu_checks.py, the Python half of tools/gpu_check.sh: its CPU path passes, and a failed check fails the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_checks  # noqa: E402  (repository upkeep, not part of the package)


def test_the_cpu_path_passes_and_skips_the_gpu_parts(tmp_path, capsys):
    assert gpu_checks.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rows = {r["check"]: r["status"] for r in json.loads((tmp_path / "gpu_checks.json").read_text())["rows"]}
    for name in ("B1 prefill logits", "B2 score bytes", "B3 peaks dtype", "B4 op count", "B5 fp32 identical"):
        assert rows[name] == "PASS", name
    assert rows["B4 CUDA graph"] == rows["B8 mask device"] == "SKIP"
    assert "all checks passed" in capsys.readouterr().out


def test_a_failed_check_makes_the_run_fail(monkeypatch, tmp_path):
    def broken(report, model, n):
        report.check("B1 prefill logits", False, "pretend the prefill computed every position's logits")

    monkeypatch.setattr(gpu_checks, "check_b1_prefill_head", broken)
    assert gpu_checks.main(["--quick", "--device", "cpu"]) == 1


def test_the_shell_script_runs_these_checks_and_propagates_failures():
    script = (ROOT / "tools" / "gpu_check.sh").read_text()
    assert "tools/gpu_checks.py" in script and "status=1" in script and 'exit "$status"' in script
    assert "set -e" not in script.replace("set -uo pipefail", "")  # every part runs, then the status is reported
