"""The KV memory calculator's view: its report as a small HTML table."""

from __future__ import annotations

import html

from ..measure.kv_memory import GB, KVReport


def report_html(r: KVReport) -> str:
    """The result as a small HTML table."""
    verdict = ('<b style="color:#1b7f3b">fits</b>' if r.fits else '<b style="color:#b00020">does not fit</b>')
    rows = [
        ("KV bytes per token", f"{r.bytes_per_token:,} B"),
        (f"per user ({r.length:,} tokens)", f"{r.per_user_bytes / GB:,.3f} GB"),
        (f"total ({r.users:,} users)", f"{r.total_gb:,.3f} GB ({verdict} in {r.gpu_memory_gb:g} GB)"),
        ("model weights", f"{r.weight_bytes / GB:,.2f} GB"),
        ("users that fit beside the weights", f"<b>{r.users_fit:,}</b>"),
    ]
    body = "".join(f"<tr><td style='padding-right:1em'>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table><small>{html.escape(r.model)}, {r.dtype}; GB = 10<sup>9</sup> bytes</small>"
