"""Shared fixtures: a tiny random-weight Llama for fast tests, the real model for integration tests."""

from __future__ import annotations

import os

# No test may need a model hub. Set before any test module imports transformers/huggingface_hub,
# which read this variable once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from tiny_models import tiny_llama, tiny_llama_config  # noqa: E402,F401  (re-exported for fixtures)


@pytest.fixture
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def real():
    """The real default model on the CPU in fp32 (fetched and converted once into the cache)."""
    from llm_anatomy import load_model

    return load_model(device="cpu", verbose=False)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "real" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)

