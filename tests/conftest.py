"""Shared fixtures: a tiny random-weight Llama for fast tests, the real model for integration tests."""

from __future__ import annotations

import os

# No test may need a model hub. Set before any test module imports transformers/huggingface_hub,
# which read this variable once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from llm_anatomy.weights.random import random_llama  # noqa: E402


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tests on one torch thread. On a busy two-core machine, two threads that wait for each other
    at every small tensor operation made small-step tests (fake quantization, speculative rounds) ten times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_model():
    return random_llama()


@pytest.fixture(scope="session")
def real():
    """The real default model on the CPU in fp32 (fetched and converted once into the cache)."""
    from llm_anatomy import load_model

    return load_model(device="cpu", verbose=False)


@pytest.fixture(scope="session")
def real_scratch(real):
    """The from-scratch model over the real weights (shared with `real`, no copy), built once for the tests that only
    run it. A test that swaps its weights or modules builds its own with ScratchLlama.from_hf(real.model)."""
    from llm_anatomy.model.scratch import ScratchLlama

    return ScratchLlama.from_hf(real.model)


@pytest.fixture
def story_prompt(real):
    """The chat prompt `[1, seq]` whose greedy tokens test_scratch (128) and test_fused (the first 32 of the same
    reference) check against transformers."""
    from llm_anatomy.generate.chat import chat_prompt_ids

    return chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "Write a short story about a robot."}])


@pytest.fixture(scope="session")
def greedy_reference(real):
    """transformers' greedy generate on the real model, run once per prompt for the whole session: several files check
    their decoding against the same reference. reference(ids, new_tokens, **options) -> the new token ids, a fresh
    list each time; ids a list or a [1, seq] tensor; options are generate's (eos_token_id=None, repetition_penalty=...).

    A batch of one with no padding: the pad id changes nothing. A shorter run of a prompt already run longer with the
    same options is that run's first tokens (greedy: each step sees only the tokens before it, and an end token stops
    both at the same place); only with the options known to keep that (an end token, a repetition penalty): others
    (min_new_tokens, prompt lookup) may change the steps by the run's length, and run on their own. Every run takes
    the threads the course's policy gave when the fixture started (one per free core, as load_model chooses),
    whichever module asks: a module's one_torch_thread would slow a long run on an idle machine.
    """
    import torch

    from llm_anatomy.device import choose_cpu_threads, torch_threads

    threads = choose_cpu_threads().threads  # measured once (0.2 s), not at every run
    done = {}

    def reference(ids, new_tokens: int, **options) -> list[int]:
        if isinstance(ids, torch.Tensor):
            assert ids.dim() == 1 or ids.shape[0] == 1, "one prompt at a time"
            ids = ids.reshape(-1).tolist()
        ids = [int(i) for i in ids]
        same = (tuple(ids), tuple(sorted(options.items())))
        longer = [n for (key, n) in done if key == same and n >= new_tokens]
        if longer and set(options) <= {"eos_token_id", "repetition_penalty"}:
            return done[same, min(longer)][:new_tokens]
        if (same, new_tokens) not in done:
            prompt = torch.tensor([ids])
            with torch_threads(threads), torch.inference_mode():
                out = real.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                          do_sample=False, pad_token_id=real.tokenizer.eos_token_id, **options)
            done[same, new_tokens] = out[0, len(ids):].tolist()
        return list(done[same, new_tokens])

    return reference


@pytest.fixture(scope="session")
def reference_tokenizer():
    """The default model's own tokenizer, read from the course's cache (no weights, no network)."""
    from transformers import AutoTokenizer

    from llm_anatomy.weights.cache import fetch_default_model

    return AutoTokenizer.from_pretrained(fetch_default_model())


@pytest.fixture(scope="module")
def ours(reference_tokenizer):
    """Our BPE encoder built from the model's vocabulary and merges."""
    from llm_anatomy.tokens.bpe import BPETokenizer

    return BPETokenizer.from_hf(reference_tokenizer)


def _fast_run(config, items) -> None:
    """make test-fast (LLM_ANATOMY_FAST=1): leave out the tests tests/DURATIONS.md lists as slow in the last full run."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    import durations  # repository upkeep, not part of the package

    from busy_background import _busy_notebook

    listed = root / "tests" / "DURATIONS.md"
    slow = durations.slow_tests(listed.read_text()) if listed.exists() else set()
    # the busy-machine reruns: a full run times them in the background, not in their tests, so the list misses them
    slow |= {item.nodeid for item in items if _busy_notebook(item)}
    keep = [item for item in items if item.nodeid not in slow]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in slow])
        items[:] = keep


def pytest_configure(config):
    """make test's busy-machine reruns run beside the unit tests (tests/busy_background.py)."""
    from busy_background import NAME, BusyBackground

    if not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.register(BusyBackground(), NAME)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLM_ANATOMY_FAST"):
        _fast_run(config, items)
    for item in items:
        if "real" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)

