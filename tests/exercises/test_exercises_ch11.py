"""Notebook 11's checks: the solutions pass on streams and queues they never saw; each typical mistake and each
shortcut is refused with the message that names it."""

from __future__ import annotations

import json
import math

from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.exercises import ch11

solutions = load_solutions("ch11")


def test_the_solutions_pass():
    for verdict in (ch11.check_sse_event(solutions.sse_event), ch11.check_stop_matcher(solutions.Matcher),
                    ch11.check_admission(solutions.admit_or_refuse)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    for check in (ch11.check_sse_event, ch11.check_stop_matcher, ch11.check_admission):
        assert "not attempted" in check(unattempted).message
    not_yet(ch11.check_sse_event(None), "define")


def test_sse_mistakes():
    not_yet(ch11.check_sse_event(lambda p: b"data: " + json.dumps(p).encode() + b"\n"), "empty line")
    not_yet(ch11.check_sse_event(lambda p: json.dumps(p).encode() + b"\n\n"), "data: ")
    not_yet(ch11.check_sse_event(lambda p: ("data: " + str(p) + "\n\n").encode()), "str(payload)")
    not_yet(ch11.check_sse_event(lambda p: b"data: " + json.dumps(p, indent=None).encode().replace(b"\\n", b"\n")
                                 + b"\n\n"), "newline inside the payload")
    not_yet(ch11.check_sse_event(lambda p: None), "bytes")


def test_any_sse_the_openai_decoder_reads_passes():
    """The standard's other lines (id, event, retry, a comment) and its other line endings (CRLF, CR) are valid SSE that
    the openai client reads: the check accepts them, as it accepts the plain `data:` line."""
    line = b"data: %s"
    for frame in (b"id: 7\n" + line + b"\n\n", b"event: message\n" + line + b"\n\n", b": keep-alive\n" + line + b"\n\n",
                  b"retry: 1000\n" + line + b"\n\n", line + b"\r\n\r\n", b"id: 7\r\n" + line + b"\r\n\r\n",
                  line + b"\r\r", b"data:%s\n\n", b": one\n: two\nevent: chunk\nid: 1\n" + line + b"\r\n\n"):
        verdict = ch11.check_sse_event(lambda p, frame=frame: frame % json.dumps(p).encode())
        assert verdict.passed, (frame, verdict.message)


def test_the_servers_own_framing_is_refused_however_it_is_reached():
    from llm_anatomy.server import schemas
    from llm_anatomy.server.schemas import sse

    not_yet(ch11.check_sse_event(sse), "don't call", "sse")
    not_yet(ch11.check_sse_event(lambda p, frame=schemas.sse: frame(p)), "don't call", "sse")


class _PieceByPiece(solutions.Matcher):
    """Holds back as it should, but looks for a stop string in each new piece alone: misses one that spans pieces."""

    def feed(self, text):
        if self.stopped:
            return ""
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            shown, self.pending = self.pending + text[:min(cuts)], ""
            return shown
        self.pending += text
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        shown, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return shown


class _NoHoldBack(solutions.Matcher):
    """Cuts at a stop string in all the text, but shows everything else at once."""

    def feed(self, text):
        if self.stopped:
            return ""
        before, self.pending = self.pending, self.pending + text
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            return self.pending[len(before):min(cuts)] if min(cuts) >= len(before) else ""
        return text


class _HoldsEverything(solutions.Matcher):
    """Shows nothing until the end: right text, no streaming."""

    def feed(self, text):
        self.pending += text
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
        return ""

    def flush(self):
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        return self.pending[:min(cuts)] if cuts else self.pending


class _ShowsTheStop(solutions.Matcher):
    def feed(self, text):
        shown = super().feed(text)
        return shown + (self.stops[0] if self.stopped else "")


class _HoldsTheShortest(solutions.Matcher):
    """Holds back the SHORTEST end that begins a stop string: with "abab" after "xaba" it holds "a" and shows "xab",
    then never sees "abab" whole, and shows it."""

    def feed(self, text):
        if self.stopped:
            return ""
        self.pending += text
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            shown, self.pending = self.pending[:min(cuts)], ""
            return shown
        hold = min((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        shown, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return shown


def test_stop_matcher_mistakes():
    not_yet(ch11.check_stop_matcher(_PieceByPiece), "not in each piece alone")
    not_yet(ch11.check_stop_matcher(_NoHoldBack), "could still become", "hold back the longest end")
    not_yet(ch11.check_stop_matcher(_HoldsEverything), "a user is waiting")
    not_yet(ch11.check_stop_matcher(_ShowsTheStop), "never shown")
    not_yet(ch11.check_stop_matcher(_HoldsTheShortest), "LONGEST", "not the shortest")


def test_holding_the_shortest_end_shows_the_stop_string_and_never_stops():
    """The stream the check added for it: the wrong matcher shows "abab" and does not stop; the solution stops."""
    wrong, right = _HoldsTheShortest(["abab"]), solutions.Matcher(["abab"])
    assert "".join(wrong.feed(p) for p in ("xaba", "b", "!")) + wrong.flush() == "xabab!" and not wrong.stopped
    assert "".join(right.feed(p) for p in ("xaba", "b", "!")) + right.flush() == "x" and right.stopped


def test_the_librarys_stop_matcher_is_refused_however_it_is_reached():
    from llm_anatomy.generate.stops import StopMatcher

    class Wrapper(solutions.Matcher):
        def __init__(self, stops):
            super().__init__(stops)
            self.inner = StopMatcher(stops)

        def feed(self, text):
            return self.inner.feed(text)

    not_yet(ch11.check_stop_matcher(Wrapper), "don't call", "StopMatcher")
    not_yet(ch11.check_stop_matcher(StopMatcher), "don't call", "StopMatcher")


def test_admission_mistakes():
    def off_by_one(waiting, limit, each):
        return solutions.admit_or_refuse(waiting - 1, limit, each) if limit is not None else (True, 0)

    not_yet(ch11.check_admission(off_by_one), "FEWER than")
    not_yet(ch11.check_admission(lambda w, lim, e: (lim is None or w < lim, 0)), "Retry-After 0")
    not_yet(ch11.check_admission(lambda w, lim, e: (True, 0) if lim is None or w < lim else
                                 (False, (w - lim + 1) * e)), "whole number")
    not_yet(ch11.check_admission(lambda w, lim, e: (True, 0) if lim is None or w < lim else
                                 (False, max(1, round((w - lim) * e)))), "rounded up")
    not_yet(ch11.check_admission(lambda w, lim, e: (w < (lim or 0), 1)), "None means no limit")
    assert math.ceil(2.1) == 3


def test_the_servers_admission_is_refused():
    from llm_anatomy.server.engine import admission

    not_yet(ch11.check_admission(admission), "don't call", "admission")
    not_yet(ch11.check_admission(lambda *a: admission(*a)), "don't call", "admission")
