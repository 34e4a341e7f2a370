"""When to stop, and text as a user sees it while tokens stream: stop strings that span tokens, and text that never
shows half a character.

`finish_reason(params, output)` is the one stop rule on token ids that every loop asks (GenerationSession, a served
Request, the server): "stop" after one of params.stop_token_ids, "length" at params.max_tokens, None to go on.
Stop strings need text, so they stay with `StopMatcher` (built from params.stop).

A model emits token ids; a user reads text. Two things break when ids are turned into text one at a time:
- a stop string (`"\\n\\nUser:"`) can arrive split across several tokens, so no single token's text contains it;
  `StopMatcher` holds back the end of the text that could still become a stop string, and cuts at the first match;
- a byte-level BPE token can end in the middle of a UTF-8 character (an emoji is 4 bytes, often 2 tokens), and
  decoding that token alone prints U+FFFD, the replacement character; `StreamingDetokenizer` decodes a window of
  ids and emits only text that no later token can change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import CourseError

REPLACEMENT = "\ufffd"  # what a decoder prints for bytes that are not (yet) a whole UTF-8 character


def finish_reason(params, output: Sequence[int]) -> str | None:
    """Why a generation with `params` (a sampling.SamplingParams) that wrote `output` is finished: "stop" when its
    last token is one of params.stop_token_ids, "length" when it has params.max_tokens tokens, None while it goes on
    (vLLM's words; a stop token that is also the last allowed one is a "stop")."""
    if output and output[-1] in params.stop_token_ids:
        return "stop"
    if len(output) >= params.max_tokens:
        return "length"
    return None


class StopMatcher:
    """Feed text as it streams; get back what is safe to show, and whether a stop string was reached.

    The stop string itself is never shown (the OpenAI API's behaviour). Text that might be the start of a stop
    string is held back until the next piece decides; `flush()` returns it when the stream ends without a stop.
    """

    def __init__(self, stops: Iterable[str] = ()):
        stops = [stops] if isinstance(stops, str) else list(stops)
        if any(not isinstance(s, str) or not s for s in stops):
            raise CourseError(f"Stop strings must be non-empty strings, not {stops!r}.")
        self.stops = stops
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of all text so far that can be shown now (possibly ""); sets `stopped` at a stop string."""
        if self.stopped:
            return ""
        self.pending += text
        cuts = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            shown, self.pending = self.pending[:min(cuts)], ""
            return shown
        hold = self._could_start_a_stop()
        shown, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        return shown

    def flush(self) -> str:
        """What was held back, at the end of a stream that met no stop string."""
        shown, self.pending = ("" if self.stopped else self.pending), ""
        return shown

    def _could_start_a_stop(self) -> int:
        """The length of the longest end of `pending` that is the beginning of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:k]):
                    best = k
                    break
        return best


class StreamingDetokenizer:
    """Turn streamed token ids into text pieces whose concatenation equals decoding all the ids at once.

    `tokenizer` is anything with `decode(list[int]) -> str` (ours or transformers'). Each `push` decodes the ids
    since the last emitted piece together with the new one and emits the new text only when it does not end in
    U+FFFD, so a character split across tokens is shown whole, once its last byte arrives.
    """

    def __init__(self, tokenizer):
        if not callable(getattr(tokenizer, "decode", None)):
            raise CourseError("StreamingDetokenizer needs a tokenizer with a decode(ids) method.")
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0  # ids before this index are shown, and their text is final

    def push(self, token_id: int) -> str:
        """The new text that `token_id` completes ("" while a character is still incomplete)."""
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids[self.start:])
        if text.endswith(REPLACEMENT):
            return ""  # the last bytes may belong to a character still arriving
        self.start = len(self.ids)
        return text

    def flush(self) -> str:
        """Whatever is still held back when the stream ends (a truly broken character shows as U+FFFD)."""
        if self.start == len(self.ids):
            return ""
        text = self.tokenizer.decode(self.ids[self.start:])
        self.start = len(self.ids)
        return text
