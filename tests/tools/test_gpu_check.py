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


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for Python: records each call; fails the step named in $FAIL; answers "0" to the script's questions
echo "$*" >> "$CALLS"
case "$*" in
  *"$FAIL"*) echo "pretend this step failed"; exit 1 ;;
  -c*) echo 0 ;;
esac
exit 0
"""


def _run_script(tmp_path, fail: str):
    import subprocess

    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": "/usr/bin:/bin", "PY": str(fake), "OUT": str(tmp_path / "out"), "CALLS": str(calls), "FAIL": fail}
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    return done, calls.read_text()


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
@pytest.mark.parametrize("fail", ["tools/gpu_checks.py", "pytest"])
def test_the_shell_script_runs_every_step_and_fails_when_one_does(tmp_path, fail):
    done, calls = _run_script(tmp_path, fail)
    assert done.returncode == 1 and "gpu_check: FAILED" in done.stdout
    assert "tools/gpu_checks.py" in calls and "pytest tests/generate/test_decode.py" in calls  # both steps ran
    assert "skipped: needs a CUDA GPU" in done.stdout  # the fake machine has no GPU: step 3 says so


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_the_shell_script_passes_when_every_step_does(tmp_path):
    done, _ = _run_script(tmp_path, fail="nothing fails")
    assert done.returncode == 0 and "gpu_check: all passed" in done.stdout
