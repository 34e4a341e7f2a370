"""Solutions to the exercises of notebook 11 (behind the API)."""

from __future__ import annotations

import json
import math


def sse_event(payload):
    """Exercise 11.1: one server-sent event: `data: `, the payload as one line of JSON, and the empty line."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class Matcher:
    """Exercise 11.2: show what cannot become a stop string; hold back the rest; cut at the first stop string."""

    def __init__(self, stops):
        self.stops, self.pending, self.stopped = list(stops), "", False

    def feed(self, text):
        if self.stopped:
            return ""
        self.pending += text
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            shown, self.pending = self.pending[:min(cuts)], ""
            return shown
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        shown, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return shown

    def flush(self):
        shown, self.pending = ("" if self.stopped else self.pending), ""
        return shown


def admit_or_refuse(waiting, limit, seconds_per_admission):
    """Exercise 11.3: queue while fewer than `limit` wait; else 429, back after the admissions that free a place."""
    if limit is None or waiting < limit:
        return True, 0
    return False, max(1, math.ceil((waiting - limit + 1) * seconds_per_admission))
