"""The KV calculator's HTML: its figures, its verdict, and the model name escaped."""

from __future__ import annotations

from dataclasses import replace

from llm_anatomy.measure.kv_memory import GIB, kv_report
from llm_anatomy.views.kv_memory import report_html


def test_the_table_shows_the_reports_figures_and_verdict():
    r = kv_report("Llama-3-8B", 8192, users=4, dtype="bf16", gpu_memory_gib=80)
    html = report_html(r)
    assert f"{r.bytes_per_token:,} B" in html and f"{r.per_user_bytes / GIB:,.3f} GiB" in html
    assert f"<b>{r.users_fit:,}</b>" in html
    assert ("fits" in html) and ("does not fit" not in html) == r.fits
    crowded = replace(r, users=r.users_fit + 1)
    assert "does not fit" in report_html(crowded)


def test_the_model_name_is_escaped():
    r = replace(kv_report("Llama-3-8B", 1024), model="<script>x</script>")
    html = report_html(r)
    assert "<script>" not in html and "&lt;script&gt;" in html
