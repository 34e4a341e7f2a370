"""`python -m llm_anatomy serve`: in the dispatch, its options, 127.0.0.1 by default (tests/server/ runs it for real)."""

from __future__ import annotations

from cli_helpers import run_cli


def test_serve_is_a_command_and_binds_this_machine_only_by_default(monkeypatch):
    from llm_anatomy.cli import main, serve

    assert main.COMMANDS["serve"][0] is serve.main
    seen = {}
    monkeypatch.setattr("llm_anatomy.server.launch.run", lambda host, port, **kw: seen.update(host=host, port=port, **kw))
    monkeypatch.setenv("LLM_ANATOMY_API_KEY", "from-env")
    assert serve.main(["--max-waiting", "3", "--max-batched-tokens", "none"]) == 0
    assert (seen["host"], seen["port"], seen["api_key"], seen["max_waiting"]) == ("127.0.0.1", 8000, "from-env", 3)
    assert seen["max_batched_tokens"] is None and seen["prefix_cache"] is True and seen["ttft_objective_s"] is None
    assert serve.main(["--max-waiting", "auto", "--ttft-objective-ms", "500"]) == 0
    assert (seen["max_waiting"], seen["ttft_objective_s"]) == ("auto", 0.5)
    assert seen["prefill_first"] is True  # new prompts get a step of their own, by default
    assert serve.main(["--mixed-steps"]) == 0 and seen["prefill_first"] is False


def test_serve_help_names_the_options():
    """In this process: the real entry of serve runs in tests/server/conftest.py, a server in a subprocess."""
    out = run_cli("serve", "--help")
    assert out.code == 0 and "--api-key" in out.out and "--max-waiting" in out.out
