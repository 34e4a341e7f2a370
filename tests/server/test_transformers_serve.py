"""Our server against the reference: `transformers serve --continuous-batching` on the same model files, offline,
both asked through the real `openai` client. Greedy answers must be the same text, with the same finish reason and
the same token counts, whole and streamed, chat and completions, one at a time and several at once.

One difference is deliberate, and asserted: an answer that ends its turn counts one completion token more there
(transformers counts the end-of-turn token it drew, as vLLM does); ours counts the tokens of the answer's text."""

from __future__ import annotations

import concurrent.futures as cf

import psutil
import pytest

QUESTIONS = ("What is 2 + 2?", "Name three colours.", "Say hello politely.", "What is the capital of France?")
PROMPTS = ("The capital of France is", "Once upon a time")


@pytest.fixture(scope="module")
def theirs():
    """transformers serve on the course's model folder (fp32, CPU), stopped at the end and checked gone."""
    import openai

    from llm_anatomy.server.launch import ServerProcess
    from llm_anatomy.weights.cache import default_model_dir

    folder = str(default_model_dir())
    proc = ServerProcess.transformers(folder, "--continuous-batching", "--device", "cpu", "--dtype", "float32",
                                      ready_timeout_s=180)
    with proc:
        tree = [psutil.Process(proc.proc.pid), *psutil.Process(proc.proc.pid).children(recursive=True)]
        yield openai.OpenAI(base_url=proc.url, api_key="none", max_retries=0, timeout=120), folder
    assert not proc.running
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _chat(client, model, question, stream=False, max_tokens=20):
    """(text, finish_reason, prompt_tokens, completion_tokens) of one greedy chat answer (streamed: no usage)."""
    messages = [{"role": "user", "content": question}]
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                     temperature=0, stream=True))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), finish[-1], None, None
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    return (whole.choices[0].message.content, whole.choices[0].finish_reason, whole.usage.prompt_tokens,
            whole.usage.completion_tokens)


def test_greedy_chat_answers_are_transformers_serves(client, model_id, theirs):
    reference, folder = theirs
    ours = [_chat(client, model_id, q) for q in QUESTIONS]
    want = [_chat(reference, folder, q) for q in QUESTIONS]
    assert [(text, finish, prompt) for text, finish, prompt, _ in ours] == [w[:3] for w in want]
    assert [n + (finish == "stop") for _, finish, _, n in ours] == [w[3] for w in want]  # + their end-of-turn token
    assert len({text for text, *_ in ours}) == len(QUESTIONS) and all(text for text, *_ in ours)
    assert {finish for _, finish, *_ in ours} == {"stop", "length"}  # one ended its turn, one ran out of tokens


def test_streamed_greedy_chat_answers_are_transformers_serves(client, model_id, theirs):
    reference, folder = theirs
    ours = [_chat(client, model_id, q, stream=True) for q in QUESTIONS[:2]]
    assert ours == [_chat(reference, folder, q, stream=True) for q in QUESTIONS[:2]]
    assert [text for text, *_ in ours] == [_chat(client, model_id, q)[0] for q in QUESTIONS[:2]]


def test_greedy_completions_are_transformers_serves(client, model_id, theirs):
    reference, folder = theirs

    def complete(c, model, prompt):
        out = c.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
        return out.choices[0].text, out.choices[0].finish_reason, out.usage.prompt_tokens, out.usage.completion_tokens

    ours = [complete(client, model_id, p) for p in PROMPTS]
    assert ours == [complete(reference, folder, p) for p in PROMPTS]
    assert all(n == 12 and text.strip() for text, _, _, n in ours)


def test_answers_batched_together_are_transformers_serves_batched(client, model_id, theirs):
    """Both servers batch requests that come together (ours: two slots and a queue of one, so three at most;
    theirs: continuous batching)."""
    reference, folder = theirs
    asks = QUESTIONS[1:]
    with cf.ThreadPoolExecutor(len(asks)) as pool:
        ours = list(pool.map(lambda q: _chat(client, model_id, q)[0], asks, timeout=240))
        want = list(pool.map(lambda q: _chat(reference, folder, q)[0], asks, timeout=240))
    assert ours == want and len(set(ours)) == len(asks)
