"""README's claims and contents, and for each claim the cells of the book that demonstrate it.

A claim links to cells by nbformat 4.5 cell id (`NN_name.html#cell-id=<id>`): the ids are committed with the
notebooks, so the anchors stay put while the text around them changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.busy_check import verdicts as cell_verdicts
from tools.site.pages import BuildError, Page, _shown, _source_text

VERDICT_KINDS = ("holds", "reading", "not shown", "failed")  # as tools/busy_check.py reads a cell's outputs


@dataclass
class ClaimLink:
    page: Page
    cell_id: str
    label: str
    rank: int  # 0: a claim()/reading() cell, 1: a heading, 2: the text, 3: the objectives or summary

    @property
    def href(self) -> str:
        return f"{self.page.html_name}#cell-id={self.cell_id}"


def readme_claims(readme: Path) -> list[tuple[str, str]]:
    """[(id, claim)] from README's table of claims (`| C1 | A tokenizer ... |`)."""
    rows = re.findall(r"^\|\s*(C\d{1,2})\s*\|\s*(.+?)\s*\|\s*$", readme.read_text(encoding="utf-8"), re.M)
    if not rows:
        raise BuildError(f"{_shown(readme)} has no table of claims (rows like `| C1 | ... |`)")
    return rows


def readme_contents(readme: Path) -> dict[str, str]:
    """{notebook file name: 'what you do'} from README's contents table."""
    found = {}
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\|\s*\[notebooks/(\d\d_[a-z0-9_]+\.ipynb)\]\([^)]*\)\s*\|\s*(.*?)\s*\|", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


CLAIM_CALL = re.compile(r"\b(?:claim|reading)\(\s*[\"'](C\d{1,2})[\"']")


def claim_links(pages: list[Page], claim_ids: list[str]) -> dict[str, list[ClaimLink]]:
    """For each claim, per notebook, the cell that best demonstrates it.

    Best is a code cell that checks it (`claim("C8", ...)` or `reading("C11", ...)`), then a heading that names it
    ("## 5. The roofline (C11)"), then text that names it, then the objectives or the summary.
    """
    links: dict[str, list[ClaimLink]] = {cid: [] for cid in claim_ids}
    for page in pages:
        best: dict[str, ClaimLink] = {}
        section, intro, summary = page.title, True, False
        for cell in page.nb.cells:
            text = _source_text(cell)
            found: dict[str, int] = {}
            if cell.cell_type == "markdown":
                for line in text.splitlines():
                    heading = re.match(r"^(#+)\s+(.+)$", line)
                    if heading:
                        if len(heading.group(1)) >= 2:
                            intro = False
                        summary = summary or bool(re.match(r"(?i)summary\b", heading.group(2)))
                        section = re.sub(r"[*_`]", "", heading.group(2)).strip()
                    if line.lstrip().startswith("|"):
                        continue  # a table row (a map of the course) refers to claims; it shows none
                    rank = 1 if heading and not intro and not summary else (3 if intro or summary else 2)
                    line = re.sub(r"\bC\d{1,2}\s*[\u2013-]\s*C\d{1,2}\b", "", line)  # a range names, shows none
                    for cid in re.findall(r"\b(C\d{1,2})\b", line):
                        found[cid] = min(found.get(cid, 9), rank)
            elif cell.cell_type == "code":
                for cid in CLAIM_CALL.findall(text):
                    found[cid] = 0
            for cid, rank in found.items():
                if cid in links and (cid not in best or rank < best[cid].rank):
                    label = page.title if section == page.title else f"{page.number} · {_claimless(section)}"
                    best[cid] = ClaimLink(page, cell.get("id", ""), label, rank)
        for cid, link in best.items():
            links[cid].append(link)
    return links


def _claimless(title: str) -> str:
    """'5. The roofline (C11)' -> '5. The roofline'."""
    return re.sub(r"\s*\((?:claims?\s*)?C\d{1,2}(?:\s*,\s*C\d{1,2})*\)", "", title).strip()


def verdict_counts(pages: list[Page], claim_ids: list[str]) -> dict[str, dict[str, int]]:
    """For each claim, how many cells of this execution ended with each verdict: 'holds' (a green claim line),
    'reading' (a measurement the prose reads), 'not shown' (this machine cannot show it: an amber line), 'failed'."""
    counts = {cid: dict.fromkeys(VERDICT_KINDS, 0) for cid in claim_ids}
    for page in pages:
        for marks in cell_verdicts(page.nb).values():
            for mark in marks:
                cid, _, kind = mark.partition(" ")
                if cid in counts and kind in counts[cid]:
                    counts[cid][kind] += 1
    return counts
