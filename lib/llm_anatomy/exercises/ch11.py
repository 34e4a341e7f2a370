"""Checks for notebook 11 (behind the API): one server-sent event, stop strings across token boundaries, and the
admission decision (queue or 429).

The SSE check reads the learner's bytes back with the official `openai` client's own decoder; the stop-string check
compares every step with generate/stops.StopMatcher on streams the notebook never showed (that class, and the
server's own `sse` and `admission`, are refused while the learner's code runs).
"""

from __future__ import annotations

import json
import re

from ..generate import stops as stops_module
from ..server import engine, schemas
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)

_PAYLOADS = [{"id": "chatcmpl-7", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"},
                                                                                 "finish_reason": None}]},
             {"choices": [{"delta": {"content": "two\n\nlines and data: inside"}}]},  # newlines in the text
             {"choices": [{"delta": {"content": "caf\u00e9 \U0001f600"}}], "usage": {"prompt_tokens": 3}}]


def _decode(raw: bytes) -> list:
    from openai._streaming import SSEDecoder

    half = max(1, len(raw) // 2)  # cut in the middle: a client reads whatever the network hands it
    return list(SSEDecoder().iter_bytes(iter([raw[:half], raw[half:]])))


def _lines(raw: bytes) -> list[bytes]:
    """The lines of an event stream, as the SSE standard splits them: at CRLF, LF or CR."""
    return re.split(rb"\r\n|\r|\n", raw)


@exercise
@hints("An event is a line that starts with `data: ` and the payload, and then an empty line.",
       "json.dumps writes the payload on one line (a newline inside a string becomes the two characters \\n); the "
       "event ends with two newline characters: the end of the data line and the empty line.",
       "Three parts, in this order: the bytes `data: `, the payload through json.dumps, encoded to bytes, and two "
       "newline characters.")
def check_sse_event(sse_event) -> str:
    """sse_event(payload: dict) -> bytes: one server-sent event carrying the payload as JSON."""
    expect(callable(sse_event), "define sse_event(payload) that returns the event as bytes.")
    for payload in _PAYLOADS:
        with forbidden_all([(schemas, "sse")], "frame the event yourself"):
            raw = call(sse_event, json.loads(json.dumps(payload)))
        expect(isinstance(raw, (bytes, str)), f"return the event as bytes (or text), not {type(raw).__name__}.")
        raw = raw.encode() if isinstance(raw, str) else raw
        # Any event the standard allows and the openai client reads passes: `id:`, `event:`, `retry:` or comment
        # lines around the data line, and CRLF or CR line endings. The check reads what the client reads.
        expect(any(line.startswith(b"data:") for line in _lines(raw)),
               f"an event carries its payload on a line that starts with `data: `; yours has none: {raw[:40]!r}.")
        expect(_decode(raw) != [], "end the event with an empty line: the data line's newline and one more "
               f"(b\"\\n\\n\"); yours ends {raw[-6:]!r}, so the client waits for more.")
        events = _decode(raw + schemas.DONE)
        expect(len(events) == 2, f"the client read {len(events) - 1} events where you sent one: a newline inside the "
                                 "payload ended it early; let json.dumps write it on one line.")
        try:
            got = json.loads(events[0].data)
        except ValueError:
            got = None
        expect(got is not None or not events[0].data.startswith("{'"),
               "the client could not read your payload as JSON: it looks like str(payload), Python's own "
               "notation with single quotes; write it with json.dumps.")
        expect(got is not None, f"the client read {events[0].data[:50]!r}, which is not all of the JSON: a newline "
                                "inside the payload ended the event early; let json.dumps write it on one line.")
        expect(got == payload, f"the client read {events[0].data[:60]!r}, not the payload: write json.dumps(payload)")
    return "a stream is one `data: {json}` line and an empty line per chunk, and `data: [DONE]` at the end."


_STREAMS = [(["The answer", " is: 4", "2.\n\nUs", "er: more"], ["\n\nUser:"]),  # the stop arrives in two pieces
            (["a", "b", "c", "ab", "cd"], ["abcd"]),  # a false start, then the real one
            (["Hello", " world", "!"], ["STOP"]),  # no stop at all: everything shows, the end at flush
            (["x = 1", "; y", " = 2;", " END", " z"], [";;", "END"]),  # the second of two stops
            (["<", "|im", "_e", "nd|", ">tail"], ["<|im_end|>"]),
            (["Hi", " S", "T"], ["STOP"]),  # the stream ends while text is held back: flush gives it
            (["x;", " E", "N", "D!"], [";;", "END"]),  # the second stop string, split across pieces
            (["ab END c ;; d"], [";;", "END"]),  # two stops in one text: the one that comes first in it wins
            (["xaba", "b", "!"], ["abab"]),  # the stop string begins with its own end: hold back "aba", not "a"
            (["baa", "a", "c"], ["aaa"])]


@exercise
@hints("Keep the text that could still become a stop string, and show the rest.",
       "After each piece, look for a stop string in all the text held so far; if there is none, hold back the "
       "longest end of it that is the beginning of some stop string.",
       "feed adds the text to what is held. If a stop string is in it, show what comes before the first one and set "
       "stopped. Else find the largest k for which the held text ends with the first k characters of some stop "
       "string: show all but those k characters and keep them. flush gives back what is held (nothing after a stop).")
def check_stop_matcher(Matcher) -> str:
    """Matcher(stops) with .feed(text) -> what can be shown now, .flush() -> what was held, and .stopped."""
    expect(callable(Matcher), "define a class Matcher(stops) with feed(text), flush() and stopped.")
    for pieces, stops in _STREAMS:
        want, shown = stops_module.StopMatcher(stops), []
        expectations = []  # the reference, step by step, computed before the learner's code runs
        for piece in pieces:
            expectations.append(want.feed(piece))
            if want.stopped:
                break
        want_end, want_stopped = want.flush(), want.stopped
        with forbidden_all([stops_module.StopMatcher], "hold back and cut the text yourself"):
            mine = call(Matcher, list(stops))
            for piece, expected in zip(pieces, expectations):
                got = returned(call(mine.feed, piece), "text", "what feed shows")
                shown.append(got)
                text = "".join(shown)
                seen = "".join(pieces[:len(shown)])
                missed = next((s for s in stops if s in seen and not getattr(mine, "stopped", False)), None)
                expect(missed is None, f"{missed!r} has arrived (across the pieces {pieces[:len(shown)]}) but your "
                                       "matcher did not stop: look for it in all the text held so far, not in each "
                                       "piece alone.")
                leaked = next((s for s in stops if s in text), None)
                both = sorted((s for s in stops if s in seen), key=seen.index)  # in the order the text has them
                expect(leaked is None or len(both) < 2, f"{seen!r} holds two stop strings, {both}: cut at the one that "
                                                        f"comes first in the text ({both[:1]}), whatever their "
                                                        f"order in the list; you showed {leaked!r}.")
                expect(leaked is None, f"your matcher showed the stop string {leaked!r} (after {seen!r}): the stop "
                                       "string itself is never shown, and nothing after it.")
                # the longest end of what was shown that begins a stop string, when more was shown than the reference
                tail = next(((s, s[:k]) for s in stops for k in range(len(s) - 1, 0, -1) if text.endswith(s[:k])),
                            None) if len(got) > len(expected) else None
                stop, begun = tail or (None, None)
                expect(tail is None or text != seen, f"after {seen!r} you showed {got!r}, but its end {begun!r} could "
                       f"still become {stop!r}: hold back the longest end of the text that begins some stop string.")
                held = seen[len("".join(expectations[:len(shown)])):]  # what the reference holds back here
                expect(tail is None, f"after {seen!r} you showed {got!r} and held back only {seen[len(text):]!r}, "
                       f"but the longer end {held!r} begins {stop!r} too and could still become it: hold back the "
                       "LONGEST end that begins a stop string, not the shortest (a stop string such as 'abab' begins "
                       "with its own end).")
                expect(got == expected, f"after {seen!r} show {expected!r}, not {got!r}: "
                                        + ("you held back text that cannot begin any stop string; show it now, a user "
                                           "is waiting." if len(got) < len(expected) else "compare your cut with the "
                                                                                         "first stop string found."))
            end = returned(call(mine.flush), "text", "what flush returns")
        expect(end == want_end, f"at the end of {pieces} flush() should give {want_end!r}, not {end!r}: what was "
                                "held back shows when the stream ends without a stop, nothing after a stop.")
        expect(bool(getattr(mine, "stopped", None)) == want_stopped, f"after {pieces} `stopped` should be "
                                                                     f"{want_stopped}.")
    return "a stop string that spans tokens is caught by holding back only what could still become it."


_QUEUES = [(12, None, 1.0), (0, 4, 0.5), (3, 4, 0.5), (4, 4, 0.5), (5, 4, 0.25), (9, 4, 0.7), (0, 0, 2.0),
           (7, 3, 0.1), (2, 2, 3.2), (6, 4, 0.0)]  # admissions that take no time: still at least 1 s


@exercise
@hints("A request may wait while fewer than `limit` are waiting; without a limit (None) every request waits.",
       "A refused client should come back when one more place is free: after waiting - limit + 1 admissions, each "
       "taking seconds_per_admission. Retry-After counts whole seconds, rounded up, and never 0.",
       "Queue (True, 0) when there is no limit or waiting < limit. Else refuse: False, and the admissions needed "
       "(waiting - limit + 1) times the seconds each, rounded up with math.ceil, and at least 1.")
def check_admission(admit_or_refuse) -> str:
    """admit_or_refuse(waiting, limit, seconds_per_admission) -> (queue it: bool, Retry-After seconds: int)."""
    expect(callable(admit_or_refuse), "define admit_or_refuse(waiting, limit, seconds_per_admission).")
    for waiting, limit, each in _QUEUES:
        with forbidden_all([(engine, "admission")], "decide yourself: compare, then count the seconds"):
            got = returned(call(admit_or_refuse, waiting, limit, each), "pair", "(queue it, retry after)")
        want = engine.admission(waiting, limit, each)
        case = f"with {waiting} waiting, a limit of {limit} and {each} s per admission"
        expect(limit is not None or got[0], f"{case} the request must be queued: None means no limit.")
        expect(bool(got[0]) == want[0], f"{case} the answer is {'queue it' if want[0] else '429'}: a request waits "
                                        "while FEWER than `limit` are waiting (waiting < limit).")
        if not want[0]:
            expect(not isinstance(got[1], bool), f"{case} Retry-After is a whole number of seconds, not {got[1]!r}.")
            after = returned(got[1], "whole", "Retry-After (whole seconds, rounded up)")  # 4.0 or np.int64(4) is 4
            expect(after != 0, f"{case} you said Retry-After 0: the client would come back at once; the header "
                               "counts whole seconds, at least 1.")
            expect(after == want[1], f"{case} Retry-After is {want[1]} s ({waiting - limit + 1} admissions of "
                                      f"{each} s, rounded up, at least 1), not {after}.")
    return "a full queue answers at once with 429 and a Retry-After, instead of a wait that only grows."
