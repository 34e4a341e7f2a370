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

    listed = root / "tests" / "DURATIONS.md"
    slow = durations.slow_tests(listed.read_text()) if listed.exists() else set()
    keep = [item for item in items if item.nodeid not in slow]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in slow])
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLM_ANATOMY_FAST"):
        _fast_run(config, items)
    for item in items:
        if "real" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)

