"""Stop strings across token boundaries, and streamed text that never shows half a character (the real tokenizer)."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.sampling import SamplingParams
from llm_anatomy.generate.stops import REPLACEMENT, StopMatcher, StreamingDetokenizer, finish_reason


def _stream(matcher, pieces):
    shown = "".join(matcher.feed(p) for p in pieces)
    return shown + matcher.flush(), matcher.stopped


def test_a_stop_string_split_across_pieces_is_found_and_not_shown():
    assert _stream(StopMatcher(["\n\nUser:"]), ["Sure.", "\n", "\nUs", "er: hi"]) == ("Sure.", True)


def test_a_false_start_is_released_when_the_next_piece_rules_it_out():
    matcher = StopMatcher(["END"])
    assert matcher.feed("the EN") == "the "  # "EN" could still become "END": held back
    assert matcher.feed("emy") == "ENemy"
    assert _stream(StopMatcher(["END"]), ["a", "E", "N", "D", "b"]) == ("a", True)


def test_the_earliest_of_several_stops_wins_and_nothing_follows_it():
    matcher = StopMatcher(["world", "lo w"])
    assert _stream(matcher, ["hel", "lo world"]) == ("hel", True)
    assert matcher.feed("more") == ""


def test_without_a_stop_the_whole_text_comes_out():
    pieces = ["a", "bc", "\n", "d"]
    assert _stream(StopMatcher(["xyz"]), pieces) == ("abc\nd", False)
    assert _stream(StopMatcher([]), pieces) == ("abc\nd", False)


@pytest.mark.parametrize("stops", [[""], [3], "ok"])
def test_bad_stops_are_refused_or_taken_as_one(stops):
    if stops == "ok":
        assert StopMatcher("ok").stops == ["ok"]
        return
    with pytest.raises(CourseError, match="non-empty strings"):
        StopMatcher(stops)


TEXTS = ["Emoji 🙂 and 🎉 and a flag 🇫🇷.", "Korean 안녕하세요, Chinese 你好, Greek αβγ.", "plain ascii text"]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_add_up_to_the_whole_decode_with_no_replacement_character(text, reference_tokenizer):
    ids = reference_tokenizer(text)["input_ids"]
    stream = StreamingDetokenizer(reference_tokenizer)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == reference_tokenizer.decode(ids) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_naive_per_token_decoding_shows_a_replacement_character(reference_tokenizer):
    """The failure StreamingDetokenizer exists for: an emoji split over tokens prints U+FFFD mid-stream."""
    ids = reference_tokenizer("🙂")["input_ids"]
    assert len(ids) > 1
    assert any(REPLACEMENT in reference_tokenizer.decode([i]) for i in ids)


def test_a_tokenizer_without_decode_is_refused():
    with pytest.raises(CourseError, match="decode"):
        StreamingDetokenizer(object())


def test_one_rule_says_when_a_generation_is_finished_and_why():
    params = SamplingParams(max_tokens=3, stop_token_ids=[7, 9])
    assert [finish_reason(params, out) for out in ([], [1], [1, 2], [1, 9], [1, 2, 3], [1, 2, 7])] == \
        [None, None, None, "stop", "length", "stop"]  # a stop token that is also the last allowed one: "stop"
    assert finish_reason(SamplingParams(max_tokens=2), [7, 9]) == "length"  # no stop ids: only the length
    assert finish_reason(params, [7, 1]) is None  # a stop id before the last token does not count
