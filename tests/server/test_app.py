"""The routes, through the real `openai` client against a real server (conftest.py): answers whole and streamed,
the request fields, usage, logprobs, stop strings across token boundaries, seeds."""

from __future__ import annotations

import httpx
import pytest

from conftest import KEY

from llm_anatomy.server import launch

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_health_needs_no_key_and_models_lists_the_one_model(server, client, model_id):
    assert httpx.get(server.root + "/health", timeout=10).json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [model_id] and model_id.startswith("SmolLM2")


def test_a_whole_chat_answer_and_the_same_answer_streamed(client, model_id):
    whole = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    assert "Paris" in text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens > 10 and whole.usage.total_tokens == whole.usage.prompt_tokens + \
        whole.usage.completion_tokens

    chunks = list(client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len(chunks) < 60
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text  # greedy: the same tokens, whole or streamed
    assert sum(1 for p in pieces if p) > 3  # it came in pieces, not at once
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


@pytest.mark.parametrize("asked", [None, {}, {"include_usage": False}, {"include_usage": True}])
def test_usage_is_streamed_only_when_asked_in_a_last_chunk_without_choices(client, model_id, asked):
    """OpenAI's rule: with stream_options.include_usage the stream ends with one more chunk, "choices": [] and the
    usage, and every other chunk says usage null; without it no chunk carries usage. Chat and completions alike."""
    extra = {} if asked is None else {"stream_options": asked}
    wanted = bool(asked and asked.get("include_usage"))
    prompts = (client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=1).usage.prompt_tokens,
               client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=1)
               .usage.prompt_tokens)
    streams = (client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=6, temperature=0,
                                              stream=True, **extra),
               client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=6,
                                         temperature=0, stream=True, **extra))
    for prompt, chunks in zip(prompts, map(list, streams)):
        body = chunks[:-1] if wanted else chunks
        assert all(len(c.choices) == 1 and c.usage is None for c in body)
        assert body[-1].choices[0].finish_reason == "length"
        if wanted:
            last = chunks[-1]
            assert last.choices == [] and last.usage.completion_tokens == 6 and last.id == chunks[0].id
            assert last.usage.prompt_tokens == prompt and last.usage.total_tokens == prompt + 6


def test_two_requests_batched_together_give_what_each_gives_alone(client, model_id):
    import concurrent.futures as cf

    asks = [[{"role": "user", "content": q}] for q in ("Name a fruit.", "What is 2 + 2?")]
    alone = [client.chat.completions.create(model=model_id, messages=m, max_tokens=12, temperature=0)
             .choices[0].message.content for m in asks]
    with cf.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda m: client.chat.completions.create(
            model=model_id, messages=m, max_tokens=12, temperature=0).choices[0].message.content, asks, timeout=120))
    assert together == alone


def test_completions_with_a_text_or_token_prompt_and_legacy_logprobs(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  logprobs=2)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.text.startswith(" Paris")
    lp = choice.logprobs
    assert len(lp.tokens) == r.usage.completion_tokens == 6 and "".join(lp.tokens) == choice.text
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(chosen, abs=1e-5)  # greedy: the top one
               for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    ids = client.completions.create(model=model_id, prompt=[504, 3575, 282, 4649, 314], max_tokens=6, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == choice.text and ids.usage.prompt_tokens == 5


def test_chat_logprobs_name_each_token_and_its_alternatives(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)  # greedy: the chosen is the top
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)


def test_a_stop_string_across_token_boundaries_ends_the_answer_before_it(client, model_id):
    full = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    at = text.index("is Pa")  # " is" and " Paris" are two tokens: the stop string spans them
    for stream in (False, True):
        r = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=24, temperature=0,
                                           stop=["nowhere", "is Pa"], stream=stream)
        if stream:
            chunks = list(r)
            got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = chunks[-1].choices[0].finish_reason
        else:
            got, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert got == text[:at] and finish == "stop"


def test_a_seed_repeats_a_sampled_answer_and_max_tokens_bounds_it(client, model_id):
    def ask(seed):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "List random words."}],
                                           max_tokens=8, temperature=1.3, top_p=0.95,
                                           extra_body={"top_k": 50, "min_p": 0.01},
                                           seed=seed)
        return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason

    first = ask(7)
    assert ask(7) == first
    assert first[1] <= 8 and (first[1] == 8) == (first[2] == "length")
    assert len({ask(s)[0] for s in (1, 2)} | {first[0]}) > 1  # other seeds: other draws


def test_the_api_key_guards_every_route_but_health(server, model_id):
    import openai

    wrong = openai.OpenAI(base_url=server.url, api_key="not-" + KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.models.list()
    assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=2)
    for path in ("/metrics", "/v1/models"):
        assert httpx.get(server.root + path, timeout=10).status_code == 401
    assert httpx.get(server.root + "/health", timeout=10).status_code == 200


def test_a_greedy_answer_is_the_courses_own_greedy_decoding(client, model_id, real, real_scratch):
    import torch

    from llm_anatomy.generate.decode import greedy_tokens

    prompt = "Q: Name three colours.\nA:"
    ids = real.tokenizer(prompt)["input_ids"]
    want = greedy_tokens(real_scratch, torch.tensor([ids]), 16, real.tokenizer.eos_token_id)
    got = client.completions.create(model=model_id, prompt=prompt, max_tokens=16, temperature=0)
    assert got.choices[0].text == real.tokenizer.decode([t for t in want if t != real.tokenizer.eos_token_id])


def test_the_flush_returns_once_the_handlers_woken_by_the_events_have_run():
    # what the engine thread waits for after a step: the handler that an event woke has sent its chunk
    import asyncio
    import threading

    from llm_anatomy.server.app import Server

    loop, sent, ready = asyncio.new_event_loop(), [], threading.Event()
    events = asyncio.Queue()

    async def handler():
        ready.set()
        for _ in range(3):
            sent.append(await events.get())

    thread = threading.Thread(target=loop.run_until_complete, args=(handler(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        flush = Server._flusher(loop)
        for i in range(3):
            loop.call_soon_threadsafe(events.put_nowait, i)
            flush(10.0)
            assert sent == list(range(i + 1))  # written before the engine's next step would start
    finally:
        thread.join(10)
        loop.close()
    flush(0.01)  # a closed loop: returns at once, no error


def test_presence_and_frequency_penalties_give_the_generation_sessions_answer(client, model_id, real, real_scratch):
    # the same penalties through the API and through GenerationSession (generate/penalties.py), greedy, token ids
    # as the prompt: the same text; the counting answer without them is another one (" 11, 12,"; they part at the
    # 8th token)
    from llm_anatomy.generate.sampling import SamplingParams
    from llm_anatomy.generate.session import GenerationSession

    ids = real.tokenizer("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")["input_ids"]
    session = GenerationSession(real_scratch, real.tokenizer, SamplingParams(0.0, presence_penalty=2.0,
                                                                             frequency_penalty=2.0, max_tokens=8))
    want = [s.token_id for s in session.generate(ids, chat=False) if s.token_id != real.tokenizer.eos_token_id]

    def ask(**penalties):
        return client.completions.create(model=model_id, prompt=ids, max_tokens=8, temperature=0,
                                         **penalties).choices[0].text

    penalized = ask(presence_penalty=2.0, frequency_penalty=2.0)
    assert penalized == real.tokenizer.decode(want)
    assert ask() != penalized
    # vLLM's repetition_penalty (an extra field of the body) reaches the same SamplingParams as the session's
    session = GenerationSession(real_scratch, real.tokenizer, SamplingParams(0.0, repetition_penalty=3.0, max_tokens=8))
    want = [s.token_id for s in session.generate(ids, chat=False) if s.token_id != real.tokenizer.eos_token_id]
    repeated = ask(extra_body={"repetition_penalty": 3.0})
    assert repeated == real.tokenizer.decode(want) and repeated != ask()


def test_debug_calls_gives_the_model_calls_of_a_streamed_answer(server, client, model_id):
    """Each decode token of an answer comes out of one step; GET /debug/calls has that step's model call, inside the
    gap between the token and the one before it (engine clock), so a step splits into its call and the rest."""
    import json

    chunks = list(client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=6, temperature=0,
                                                 stream=True))
    record = {r["name"]: r for r in json.loads(server.get("/debug/requests"))["requests"]}[chunks[0].id]
    reply = json.loads(server.get("/debug/calls?last=50"))
    calls = reply["calls"]
    assert isinstance(reply["torch_threads"], int) and reply["torch_threads"] >= 1
    assert reply["switch_interval_s"] == pytest.approx(launch.SWITCH_INTERVAL_S)  # the server sets it (launch.py)
    assert 1 <= len(calls) <= 50 and json.loads(server.get("/debug/calls?last=0"))["calls"] == []
    times = record["token_times_s"]
    for before, after in zip(times, times[1:]):
        inside = [c for c in calls if before <= c["start_s"] and c["end_s"] <= after + 1e-9]
        assert len(inside) == 1 and inside[0]["kind"] == "decode" and inside[0]["rows"] == 1
        assert 0 < inside[0]["measured_s"] <= after - before + 1e-9
    reply = httpx.get(server.root + "/debug/calls?last=many", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "last"
