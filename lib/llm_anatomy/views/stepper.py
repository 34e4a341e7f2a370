"""The generation stepper's view: the text so far, the candidates, the KV cache gauge, the times, attention.

Pure HTML from a GenerationSession's StepResults; the widget (llm_anatomy.widgets.stepper) only wires
buttons to the session and puts these strings on screen.
"""

from __future__ import annotations

import html

from ..generate.steps import StepResult
from ..measure.timing import median_decode_step_s
from .labels import token_label

_MONO = "font-family:ui-monospace,Menlo,Consolas,monospace"


def _show_token(text: str) -> str:
    """Token text made visible in HTML (the course's one token label); an empty token as the empty-set sign."""
    return html.escape(token_label(text)) or "&#8709;"


def text_html(tokenizer, prompt_ids: list[int], generated: list[int]) -> str:
    """The prompt (grey) and each generated token as a highlighted span; the newest one marked."""
    prompt = html.escape(tokenizer.decode(prompt_ids))
    spans = []
    for i, token in enumerate(generated):
        newest = i == len(generated) - 1
        cls = "la-stepper-token la-stepper-token-new" if newest else "la-stepper-token"
        colour = "#ffd54f" if newest else ("#e3f2fd" if i % 2 == 0 else "#bbdefb")
        piece = html.escape(tokenizer.decode([token]))
        spans.append(f'<span class="{cls}" title="id {token}" style="background:{colour};border-radius:3px;'
                     f'white-space:pre-wrap">{piece}</span>')
    return (f'<div style="{_MONO};font-size:13px;line-height:1.6;white-space:pre-wrap;max-height:260px;'
            f'overflow:auto;border:1px solid #ddd;padding:6px">'
            f'<span style="color:#888">{prompt}</span>{"".join(spans)}</div>')


def chart_html(result: StepResult) -> str:
    """Horizontal bars of the top candidates' probabilities (after the filters), the chosen one marked."""
    rows = []
    for c in result.candidates:
        chosen = c.token_id == result.token_id
        cls = "la-stepper-bar la-stepper-chosen" if chosen else "la-stepper-bar"
        colour = "#e65100" if chosen else "#1976d2"
        mark = "&#9664; chosen" if chosen else ("" if c.prob > 0 else '<span style="color:#999">cut</span>')
        rows.append(f'<tr class="{cls}"><td style="{_MONO};text-align:right;padding-right:6px">'
                    f'{_show_token(c.text)}</td><td style="width:220px"><div style="background:{colour};'
                    f'height:12px;width:{max(c.prob * 100, 0.5):.1f}%"></div></td>'
                    f'<td style="{_MONO};padding-left:6px">{c.prob:6.1%}</td>'
                    f'<td style="color:#999;padding-left:6px">{c.raw_prob:6.1%}</td>'
                    f'<td style="color:#e65100;padding-left:6px">{mark}</td></tr>')
    return (f'<div><b>Next-token candidates</b> (token {result.index + 1}, {result.params.describe()})'
            f'<table style="border-collapse:collapse;font-size:12px"><tr style="color:#666"><th>token</th>'
            f'<th>probability</th><th>p</th><th>p at T=1</th><th></th></tr>{"".join(rows)}</table></div>')


def grammar_chart_html(result: StepResult, vocab_size: int, lookup=None) -> str:
    """The model's own top candidates with the ones a grammar removed struck out, beside the ones it kept (their
    probability under the mask and the filters), and how many of the vocabulary's tokens the grammar allows here.
    lookup: the constraint's MaskLookup for this step (its state, cached or computed now, the time), or None."""
    rows = []
    for c in sorted(result.candidates, key=lambda c: -c.raw_prob):
        chosen = c.token_id == result.token_id
        cls = "la-stepper-bar " + ("la-stepper-kept" if c.allowed else "la-stepper-removed") + (
            " la-stepper-chosen" if chosen else "")
        if c.allowed:
            token, colour = _show_token(c.text), "#e65100" if chosen else "#1976d2"
            bar = f'<div style="background:{colour};height:12px;width:{max(c.prob * 100, 0.5):.1f}%"></div>'
            mark = "&#9664; chosen" if chosen else ("" if c.prob > 0 else '<span style="color:#999">cut</span>')
            prob = f"{c.prob:6.1%}"
        else:
            token, bar, prob = f"<s>{_show_token(c.text)}</s>", "", "&#8212;"
            mark = '<span style="color:#999">removed by the grammar</span>'
        style = "" if c.allowed else ' style="color:#999"'
        rows.append(f'<tr class="{cls}" title="id {c.token_id}"{style}><td style="{_MONO};text-align:right;'
                    f'padding-right:6px">{token}</td><td style="width:220px">{bar}</td>'
                    f'<td style="{_MONO};padding-left:6px">{prob}</td>'
                    f'<td style="color:#999;padding-left:6px">{c.raw_prob:6.1%}</td>'
                    f'<td style="color:#e65100;padding-left:6px;white-space:nowrap">{mark}</td></tr>')
    allowed, cost = result.allowed_tokens, ""
    if lookup is not None:
        how = "looked up: this state was seen before" if lookup.cached else "computed now, on the state's first visit"
        cost = (f'<div class="la-stepper-mask-cost" style="font-size:12px;color:#555">automaton state {lookup.state}; '
                f'its mask {how} ({lookup.seconds * 1e3:.2f} ms)</div>')
    return (f'<div><b>Next-token candidates under the grammar</b> (token {result.index + 1}, '
            f'{result.params.describe()})<div class="la-stepper-allowed" style="font-size:12px">the grammar allows '
            f'{allowed:,} of the {vocab_size:,} tokens here; the model\'s own candidates it refuses are struck out'
            f'</div>{cost}<table style="border-collapse:collapse;font-size:12px"><tr style="color:#666"><th>token</th>'
            f'<th>probability</th><th>p</th><th>model\'s p</th><th></th></tr>{"".join(rows)}</table></div>')


def cache_html(result: StepResult) -> str:
    """A gauge of the KV cache: positions and bytes filled out of the preallocated room."""
    share = result.cache_tokens / result.cache_capacity_tokens
    return (f'<div><b>KV cache</b>: {result.cache_tokens} of {result.cache_capacity_tokens} positions, '
            f'{result.cache_bytes / 1e6:.2f} MB of {result.cache_capacity_bytes / 1e6:.2f} MB'
            f'<div style="width:320px;height:14px;border:1px solid #888;background:#f4f4f4">'
            f'<div class="la-stepper-cache-fill" style="width:{share * 100:.1f}%;height:100%;'
            f'background:#43a047"></div></div></div>')


def times_html(steps: list[StepResult], last: int = 12) -> str:
    """Prefill time against each decode step's time, as bars on one scale (milliseconds)."""
    prefill, decode = steps[0], steps[1:]
    shown = [("prefill", prefill.ms, prefill.fed_tokens)] + [(f"step {s.index}", s.ms, 1) for s in decode[-last:]]
    scale = max(ms for _, ms, _ in shown) or 1.0
    rows = "".join(
        f'<tr><td style="padding-right:6px">{name}</td><td style="width:220px"><div style="background:'
        f'{"#8e24aa" if name == "prefill" else "#00897b"};height:10px;width:{max(ms / scale * 100, 0.5):.1f}%">'
        f'</div></td><td style="{_MONO};padding-left:6px">{ms:7.1f} ms</td>'
        f'<td style="color:#999;padding-left:6px">{fed} token{"s" if fed > 1 else ""} fed</td></tr>'
        for name, ms, fed in shown)
    summary = ""
    if decode:
        median_ms = median_decode_step_s(s.ms / 1e3 for s in decode) * 1e3  # TPOT, as notebook 07 defines it
        summary = f"median decode step {median_ms:.1f} ms over {len(decode)} steps"
    return (f'<div><b>Time per model call</b><table style="font-size:12px">{rows}</table>'
            f'<div style="color:#555;font-size:12px">{summary}</div></div>')


def attention_html(tokenizer, ids: list[int], weights, layer: int, head: int) -> str:
    """Each earlier token shaded by how much the token fed last attends to it."""
    if weights is None:
        return ""
    top = float(weights.max()) or 1.0
    spans = []
    for token, w in zip(ids, weights.tolist()):
        alpha = w / top
        spans.append(f'<span title="{w:.3f}" style="background:rgba(229,57,53,{alpha:.2f});{_MONO}">'
                     f'{_show_token(tokenizer.decode([token]))}</span>')
    return (f'<div><b>Attention of the token fed last</b> (layer {layer}, head {head}; darker = more weight)'
            f'<div style="font-size:12px;line-height:1.7;max-height:160px;overflow:auto">{"".join(spans)}</div></div>')
