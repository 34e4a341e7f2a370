"""The API's shapes without a server: what is refused and how, and SSE framing read back by the openai client's own
decoder."""

from __future__ import annotations

import json

import pytest

from llm_anatomy.server import schemas
from llm_anatomy.server.schemas import APIError, ChatRequest, CompletionRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def _refusal(body, kind=ChatRequest) -> APIError:
    with pytest.raises(APIError) as err:
        schemas.parse_request(body, kind)
    assert err.value.status == 400
    return err.value


def test_a_good_request_reads_with_the_apis_defaults():
    req = schemas.parse_request({**CHAT, "stop": "\n\n", "max_tokens": 5}, ChatRequest)
    assert (req.temperature, req.top_p, req.stream, req.stops(), req.max_tokens) == (1.0, 1.0, False, ["\n\n"], 5)
    parts = schemas.parse_request({**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, ChatRequest)
    assert parts.messages[0].text() == "ab"
    assert schemas.parse_request({"model": "m", "prompt": [1, 2]}, CompletionRequest).prompt == [1, 2]
    assert (req.presence_penalty, req.frequency_penalty) == (0.0, 0.0)  # OpenAI's defaults: off
    both = schemas.parse_request({**CHAT, "presence_penalty": -2, "frequency_penalty": 1.5}, ChatRequest)
    assert (both.presence_penalty, both.frequency_penalty) == (-2, 1.5)


@pytest.mark.parametrize("extra, param", [({"temperature": -1}, "temperature"), ({"temperature": 2.5}, "temperature"),
                                          ({"temperature": float("nan")}, "temperature"), ({"top_p": 0}, "top_p"),
                                          ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "5"}, "max_tokens"),
                                          ({"stop": [""]}, "stop"), ({"stop": ["a"] * 5}, "stop"), ({"n": 2}, "n"),
                                          ({"top_logprobs": 2}, None), ({"top_k": -3}, None), ({"color": 1}, "color"),
                                          ({"presence_penalty": 2.5}, "presence_penalty"),
                                          ({"frequency_penalty": -3}, "frequency_penalty"),
                                          ({"frequency_penalty": float("nan")}, "frequency_penalty"),
                                          ({"presence_penalty": "1"}, "presence_penalty")])
def test_each_bad_field_is_named_in_one_clear_sentence(extra, param):
    err = _refusal({**CHAT, **extra})
    assert err.param == param or (param is None and err.param is None)
    assert err.body()["error"]["type"] == "invalid_request_error" and len(err.message) > 15


def test_missing_fields_and_bodies_that_are_not_json_objects():
    assert _refusal({"model": "m"}).param == "messages"
    assert "Missing required parameter" in _refusal({"messages": CHAT["messages"]}).message
    for raw in (b"{oops", b"[1]", b'{"temperature": NaN}', b"\xff\xfe"):
        with pytest.raises(APIError) as err:
            schemas.parse_json(raw)
        assert err.value.status == 400
    assert schemas.parse_json(b'{"a": 1}') == {"a": 1}


def test_one_sse_event_is_what_the_openai_client_reads_back():
    from openai._streaming import SSEDecoder

    reply = schemas.Reply("chatcmpl-1", 0, "m", "chat")
    chunk = reply.chunk("caf\u00e9\n\ndata: x")
    raw = schemas.sse(chunk) + schemas.sse(reply.chunk({}, finish="stop")) + schemas.DONE
    assert schemas.sse(chunk).endswith(b"\n\n") and schemas.sse(chunk).count(b"\n") == 2  # one line, then the end
    events = list(SSEDecoder().iter_bytes(iter([raw[:7], raw[7:40], raw[40:]])))  # cut anywhere: the same events
    assert [e.data for e in events[-1:]] == ["[DONE]"]
    assert json.loads(events[0].data) == chunk and json.loads(events[1].data)["choices"][0]["finish_reason"] == "stop"


def test_usage_and_the_legacy_logprobs_shape():
    entries = [schemas.logprob_entry(" Par", -0.5, [(" Par", -0.5), (" the", -2.0)]),
               schemas.logprob_entry("is", -0.1, [])]
    legacy = schemas.legacy_logprobs(entries, offset=3)
    assert legacy["tokens"] == [" Par", "is"] and legacy["text_offset"] == [3, 7]
    assert legacy["top_logprobs"][0] == {" Par": -0.5, " the": -2.0} and entries[0]["bytes"] == list(b" Par")
    assert schemas.usage(5, 3, 2) == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                                      "prompt_tokens_details": {"cached_tokens": 2}}
