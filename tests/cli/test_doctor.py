"""`python -m llm_anatomy doctor` prints the environment check and exits 1 when something must be fixed."""

from __future__ import annotations

from llm_anatomy.cli import doctor
from llm_anatomy.measure import environment


def test_a_ready_machine_exits_0_and_a_broken_one_1(monkeypatch, capsys):
    report = environment.environment_report(check_hashes=False)
    report["model_cache"] = "ready"
    report["python"] = "3.11.7"
    monkeypatch.setattr(doctor, "environment_report", lambda: dict(report))
    if environment.problems_in(report):  # a package the course needs is missing here: then the verdict is 1
        assert doctor.main([]) == 1
        return
    assert doctor.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith("All good: the course is ready to run.")
    broken = dict(report, model_cache="missing: model.safetensors")
    monkeypatch.setattr(doctor, "environment_report", lambda: broken)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: The default model is not in the cache yet" in out and out.rstrip().endswith("1 problem(s) to fix.")
