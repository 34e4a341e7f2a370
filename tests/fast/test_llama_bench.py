"""llama.cpp beside bench fast, without llama.cpp: a fake llama-bench prints the real binary's JSON (copied from a
run of llama-bench on the course's Q4_1 file), and broken ones (not executable, failing, no JSON) give one sentence."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from llm_anatomy.cli.bench.fast import format_table
from llm_anatomy.fast.llama_bench import HOW, find_llama_bench, llama_cpp_row

REAL_ROW = json.loads(Path(__file__).with_name("llama_bench_row.json").read_text())  # one real decode row


def _script(tmp_path: Path, body: str, name: str = "llama-bench") -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake(tmp_path: Path, speed: float) -> Path:
    """A llama-bench that answers like the real one, at `speed` tokens/s, with the threads and tokens it was asked."""
    row = {**REAL_ROW, "avg_ts": speed, "samples_ts": [speed] * 2}
    return _script(tmp_path, f"""import json, sys
a = sys.argv
row = {row!r}
row.update(n_threads=int(a[a.index("-t") + 1]), n_gen=int(a[a.index("-n") + 1]), n_prompt=int(a[a.index("-p") + 1]))
print(json.dumps([row], indent=2))""")


def test_a_llama_bench_gives_the_ratio(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    fake = _fake(tmp_path, 250.0)
    row = llama_cpp_row(str(fake), tmp_path / "model.gguf", 2, 75.0, new_tokens=16)
    assert row["tokens_per_s"] == 250.0 and row["ratio"] == pytest.approx(0.3) and row["threads"] == 2
    assert row["new_tokens"] == 16 and "-p 0 -n 16 -t 2" in row["command"]
    monkeypatch.setenv("LLAMA_BENCH", str(_fake(tmp_path / "..", 100.0)))  # the environment names it when no path does
    assert llama_cpp_row(None, tmp_path / "model.gguf", 1, 75.0)["ratio"] == pytest.approx(0.75)


@pytest.mark.parametrize("kind", ["missing", "not executable", "fails", "no json", "no decode row"])
def test_a_bad_llama_bench_is_one_sentence(tmp_path, monkeypatch, kind):
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    bodies = {"fails": "import sys; print('error: failed to load model', file=sys.stderr); sys.exit(1)",
              "no json": "print('| model | size | t/s |')",
              "no decode row": f"import json; print(json.dumps([{{**{REAL_ROW!r}, 'n_prompt': 512, 'n_gen': 0}}]))"}
    if kind == "missing":
        path = tmp_path / "nowhere" / "llama-bench"
    elif kind == "not executable":
        path = tmp_path / "llama-bench"
        path.write_text("not a program")
        path.chmod(0o644)
    else:
        path = _script(tmp_path, bodies[kind])
    row = llama_cpp_row(str(path), tmp_path / "model.gguf", 2, 75.0)
    assert row["tokens_per_s"] is None and "ratio" not in row
    note = row["note"]
    assert note.count(". ") == 0 and note.endswith(".") and "llama-bench" in note and "Traceback" not in note


def test_without_a_llama_bench_the_figure_is_absent_and_the_bench_says_how(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    assert find_llama_bench(None) is None
    row = llama_cpp_row(None, tmp_path / "model.gguf", 2, 75.0)
    assert row == {"tokens_per_s": None, "note": HOW} and "tools/build_llama_bench.sh" in HOW


def test_the_table_says_llama_cpps_figure_or_how_to_get_it(tmp_path, monkeypatch):
    # only the llama.cpp line of the table, from the rows above (the rest of the table is test_bench_fast's)
    monkeypatch.delenv("LLAMA_BENCH", raising=False)

    rows = {"with": llama_cpp_row(str(_fake(tmp_path, 200.0)), tmp_path / "m.gguf", 2, 50.0),
            "without": llama_cpp_row(None, tmp_path / "m.gguf", 2, 50.0)}
    lines = {name: [line for line in _table_lines(row) if line.startswith("llama.cpp")] for name, row in rows.items()}
    assert len(lines["with"]) == 1 and "200.0 tokens/s" in lines["with"][0] and "0.25 x" in lines["with"][0]
    assert lines["without"] == [f"llama.cpp: not measured ({HOW})"]


def _table_lines(llama_row):
    """format_table of a minimal result that carries only what the table needs, and the llama.cpp row."""
    r = {"model": "tiny", "dtype": "float32", "device_name": "cpu", "quick": True, "read_bandwidth_bytes_per_s": 1e9,
         "decode": {"new_tokens": 8, "prompt_tokens": 4, "same_tokens": True, "tokens_per_s": {"fused": 10.0},
                    "step_tokens_per_s": {"fused": 12.0}, "fastest_of_all": "fused", "fastest_tokens_per_s": 10.0,
                    "fastest_vs_fused_fp32": 1.0, "fastest": "fused", "fused_vs_transformers": 1.0,
                    "plain_vs_transformers": 1.0},
         "bandwidth": {"bytes_per_token": 1e6, "tokens_per_s": 10.0, "fraction_of_read_bandwidth": 0.01,
                       "by_variant": {"fused": {"bytes_per_token": 1e6}}},
         "speculative": {"draft_length": 4, "new_tokens": 8, "task": "t", "by_model": {}},
         "tiled_attention": {"prompt_tokens": 512, "plain_peak_bytes": 2e6, "tiled_peak_bytes": 1e6, "ratio": 0.5,
                             "max_abs_difference": 0.0},
         "packed": {}, "targets": {}, "llama_cpp": llama_row}
    return format_table(r).splitlines()
