"""The KV memory calculator's view: its report as a small HTML table."""

from __future__ import annotations

import html

from ..measure.kv_memory import GIB, KVReport


def report_html(r: KVReport) -> str:
    """The result as a small HTML table."""
    verdict = ('<b style="color:#1b7f3b">fits</b>' if r.fits else '<b style="color:#b00020">does not fit</b>')
    rows = [
        ("KV bytes per token", f"{r.bytes_per_token:,} B"),
        (f"per user ({r.length:,} tokens)", f"{r.per_user_bytes / GIB:,.3f} GiB"),
        (f"total ({r.users:,} users)", f"{r.total_gib:,.3f} GiB ({verdict} in {r.gpu_memory_gib:g} GiB)"),
        ("model weights", f"{r.weight_bytes / GIB:,.2f} GiB"),
        ("users that fit beside the weights", f"<b>{r.users_fit:,}</b>"),
    ]
    body = "".join(f"<tr><td style='padding-right:1em'>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return (f"<table>{body}</table><small>{html.escape(r.model)}, {r.dtype}; GiB = 2<sup>30</sup> bytes; a server "
            "keeps some memory back (CUDA context, activations), so fewer users fit in practice</small>")
