"""The environment check reads this machine, names each problem with what to do, and reads peak memory portably."""

from __future__ import annotations

import psutil
import torch

from llm_anatomy.measure import environment


def _good() -> dict:
    report = environment.environment_report(check_hashes=False)
    report["packages"] = {name: "5.1.0" if name == "transformers" else "1.0" for name in environment.PACKAGES}
    return dict(report, python="3.11.7", model_cache="ready")


def test_the_report_reads_this_machine():
    report = environment.environment_report(check_hashes=False)
    assert report["cpu_cores"] == psutil.cpu_count(logical=True)
    assert 0 < report["ram_available_gb"] <= report["ram_total_gb"]
    assert report["packages"]["torch"] == torch.__version__ and report["packages"]["nbval"] != "not installed"
    assert set(report["packages"]) == set(environment.PACKAGES)


def test_each_problem_is_named_with_what_to_do():
    assert environment.problems_in(_good()) == []
    cases = {"python": ("3.10.4", "Python 3.10.4 is too old"), "model_cache": ("missing", "run `python -m llm_anatomy fetch`")}
    for key, (value, message) in cases.items():
        problems = environment.problems_in(dict(_good(), **{key: value}))
        assert len(problems) == 1 and message in problems[0], problems
    old = _good()
    old["packages"]["transformers"] = "4.57.1"
    assert environment.problems_in(old) == ["transformers 4.57.1 is too old: the course needs 5.x."]
    gone = _good()
    gone["packages"]["torch"] = "not installed"
    assert environment.problems_in(gone) == ["torch is not installed: run `make setup` (or pip install -r "
                                             "requirements.txt)."]


def test_the_text_report_ends_with_its_verdict():
    text = environment.format_report(_good())
    assert text.endswith("All good: the course is ready to run.") and "GPU memory" not in text
    gpu = dict(_good(), gpu_memory_total_gb=80.0, gpu_memory_free_gb=79.1, python="3.9.1")
    text = environment.format_report(gpu)
    assert "79.1 GB free of 80.0 GB" in text and text.endswith("1 problem(s) to fix.")
    assert "PROBLEM: Python 3.9.1 is too old" in text


def test_peak_memory_grows_with_what_the_process_held():
    before, how = environment.peak_memory_bytes()
    held = bytearray(200 * 2**20)  # 200 MiB, touched
    held[::4096] = b"x" * len(held[::4096])
    after, _ = environment.peak_memory_bytes()
    del held
    assert how in ("peak (VmHWM)", "peak (working set)", "current (a lower bound of the peak)")
    assert after >= before and after >= 200 * 2**20
