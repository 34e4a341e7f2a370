"""One real server for the tests of this folder: `python -m llm_anatomy serve` in a subprocess on a free port of
127.0.0.1, driven by the real `openai` client, stopped at the end and checked gone (no process left behind)."""

from __future__ import annotations

import psutil
import pytest

KEY = "test-key"


@pytest.fixture(scope="session")
def server():
    """Our server with a key, two batch slots, a queue of one, a 64 KB body limit and 64 KV blocks of 16."""
    from llm_anatomy.server.launch import ServerProcess

    proc = ServerProcess.ours("--api-key", KEY, "--max-batch", "2", "--max-waiting", "1", "--max-body-bytes",
                              "65536", "--kv-blocks", "64", "--threads", "1", ready_timeout_s=120)
    with proc:
        yield proc
        # The server and whatever it started, seen just before it stops. The fixture ends with the session, after
        # other folders' tests (a browser's exited children among them), so only the server's own tree is checked.
        tree = [psutil.Process(proc.proc.pid), *psutil.Process(proc.proc.pid).children(recursive=True)]
    assert not proc.running
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id

