"""The options every model benchmark shares (cli/bench/__init__.py): one parser, one --threads rule, one output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llm_anatomy.cli import bench
from llm_anatomy.cli.main import main


@pytest.mark.parametrize("topic", ["decode", "serving", "fast", "structured"])
def test_bad_threads_are_refused_before_any_work(topic, capsys):
    assert main(["bench", topic, "--threads", "0", "--model-size", "tiny", "--quick"]) == 1
    assert "--threads must be at least 1, not 0" in capsys.readouterr().err


@pytest.mark.parametrize("topic", ["decode", "serving", "fast", "structured"])
def test_the_real_entry_refuses_in_one_line_and_exits_1(topic):
    """The one subprocess run of each topic: `python -m llm_anatomy bench TOPIC` is wired to its main(), and an error
    is one line on stderr and exit status 1, with no traceback (the other tests call main() in this process)."""
    proc = subprocess.run([sys.executable, "-m", "llm_anatomy", "bench", topic, "--threads", "0", "--model-size",
                           "tiny", "--quick", "--json"], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "error: --threads must be at least 1, not 0.\n")


@pytest.mark.parametrize("topic", ["decode", "serving", "fast", "structured"])
def test_an_unknown_model_size_is_refused_by_the_parser(topic, capsys):
    with pytest.raises(SystemExit):
        main(["bench", topic, "--model-size", "70b"])
    assert "invalid choice: '70b'" in capsys.readouterr().err


def test_the_shared_parser_and_report():
    args = bench.parser("decode", "Decode figures.\nmore", ["default", "tiny"], "which model").parse_args(
        ["--json", "--quick", "--device", "cpu", "--model-size", "tiny", "--threads", "2"])
    assert (args.json, args.quick, args.device, args.model_size, args.threads) == (True, True, "cpu", "tiny", 2)
    assert bench.parser("x", "doc", ["default"], "h").parse_args([]).threads is None


def test_report_prints_one_json_object_or_the_table(capsys):
    assert bench.report({"a": 1}, True, lambda r: "table") == 0
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    bench.report({"spread": {"one run": float("nan"), "runs": [0.1, float("nan")]}}, True, None)
    assert json.loads(capsys.readouterr().out, parse_constant=pytest.fail) == {"spread": {"one run": None,
                                                                                          "runs": [0.1, None]}}
    bench.report({"a": 1}, False, lambda r: f"table {r['a']}")
    assert capsys.readouterr().out == "table 1\n"
    bench.progress(True)("hidden")
    bench.progress(False)("shown")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "shown\n"
