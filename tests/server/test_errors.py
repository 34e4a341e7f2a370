"""Bad input and bad days: every refusal is the API's own error body with the right status, and leaves the engine
as it was (nothing queued, nothing finished, no blocks taken); a full queue answers 429 with Retry-After."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import KEY
from server_helpers import metrics, wait_for

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy keeps counting: an answer that does not end early


def _post(server, path, body: bytes | str, key=KEY):
    return httpx.post(server.root + path, content=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _engine_state(server):
    m = metrics(server)
    return {k: v for k, v in m.items() if k.startswith(("llm_anatomy_requests_finished_total",
                                                        "llm_anatomy_num_requests", "llm_anatomy_kv_blocks_used"))}


def _chat(model_id, **fields):
    return json.dumps({"model": model_id, "messages": [{"role": "user", "content": "Hi"}], **fields})


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    ("[1, 2]", 400, None),
    ("MODEL temperature NaN", 400, None),  # NaN is not JSON
    ("MODEL temperature -0.5", 400, "temperature"),
    ("MODEL max_tokens 0", 400, "max_tokens"),
    ("MODEL max_tokens 100000", 400, "max_tokens"),  # beyond the context
    ("MODEL top_p 0", 400, "top_p"),
    ("MODEL temperature '0.5'", 400, "temperature"),  # a string is not a number
    ("MODEL frobnicate 1", 400, "frobnicate"),  # a field the API does not have
    ("MODEL presence_penalty 2.5", 400, "presence_penalty"),  # OpenAI's range is -2 .. 2
    ("MODEL frequency_penalty -3", 400, "frequency_penalty"),
    ("MODEL repetition_penalty 0", 400, "repetition_penalty"),  # vLLM's: a factor > 0
    ("NOMODEL", 404, "model"),
])
def test_a_bad_request_gets_the_apis_error_body_and_leaves_the_engine_untouched(server, model_id, body, status, param):
    before = _engine_state(server)
    if body.startswith("MODEL"):
        _, field, value = body.split(" ")
        raw = _chat(model_id).rstrip("}") + f', "{field}": {value.replace(chr(39), chr(34))}}}'
    elif body == "NOMODEL":
        raw = _chat("gpt-nothing")
    else:
        raw = body
    reply = _post(server, "/v1/chat/completions", raw)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and len(error["message"]) > 20
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert _engine_state(server) == before


def test_a_prompt_longer_than_the_context_is_refused_before_the_engine(server, model_id, client):
    import openai

    before = _engine_state(server)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, prompt=[1] * 8200, max_tokens=4)
    assert err.value.body["code"] == "context_length_exceeded" and "8192" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # the pool is 64 blocks of 16: 1024 positions
        client.completions.create(model=model_id, prompt=[1] * 1100, max_tokens=4)
    assert _engine_state(server) == before


def test_unknown_routes_and_models_are_404_and_a_big_body_is_413(server, client, model_id):
    import openai

    reply = httpx.get(server.root + "/v1/nothing", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-nothing", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.body["code"] == "model_not_found" and model_id in err.value.body["message"]
    before = _engine_state(server)
    reply = _post(server, "/v1/completions", json.dumps({"model": model_id, "prompt": "x" * 70_000}))
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    assert _engine_state(server) == before


def test_a_full_queue_answers_429_with_retry_after_and_the_others_are_served(server, client, model_id):
    import openai

    streams = []
    try:
        for _ in range(2):  # the two batch slots, each held by an answer that keeps counting
            streams.append(client.completions.create(model=model_id, prompt=COUNTING, max_tokens=400,
                                                     temperature=0, stream=True))
            next(iter(streams[-1]))  # its first token: it holds a slot
        streams.append(client.completions.create(model=model_id, prompt=COUNTING, max_tokens=400, temperature=0,
                                                 stream=True))  # the queue's one place
        assert wait_for(lambda: metrics(server)["llm_anatomy_num_requests_waiting"] == 1, 20)
        refused_before = metrics(server)["llm_anatomy_requests_rejected_queue_full_total"]
        with pytest.raises(openai.RateLimitError) as err:
            client.completions.create(model=model_id, prompt="Hello", max_tokens=2)
        assert err.value.status_code == 429 and int(err.value.response.headers["retry-after"]) >= 1
        assert err.value.body["code"] == "rate_limit_exceeded"
        assert metrics(server)["llm_anatomy_requests_rejected_queue_full_total"] == refused_before + 1
    finally:
        for s in streams:
            s.close()
    idle = wait_for(lambda: (m := metrics(server))["llm_anatomy_num_requests_running"] == 0 and
                    m["llm_anatomy_num_requests_waiting"] == 0 and m["llm_anatomy_kv_blocks_used"] == 0, 30)
    assert idle, metrics(server)
    r = client.completions.create(model=model_id, prompt="Hello", max_tokens=2)  # served again
    assert r.usage.completion_tokens >= 1


def test_the_queue_limit_can_be_changed_and_a_bad_one_is_refused(server):
    for bad in ('{"max_waiting": -1}', '{"max_waiting": "2"}', '{"max_waiting": true}', '{}'):
        reply = httpx.put(server.root + "/debug/max-waiting", content=bad, timeout=10,
                          headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_waiting"
    for limit in ("auto", None, 1):  # ends on the fixture's own limit
        reply = httpx.put(server.root + "/debug/max-waiting", json={"max_waiting": limit}, timeout=10,
                          headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 200 and reply.json() == {"max_waiting": limit}
        in_force = json.loads(server.get("/debug/requests"))["queue_limit"]
        assert in_force == limit if limit != "auto" else isinstance(in_force, int) and in_force >= 0
