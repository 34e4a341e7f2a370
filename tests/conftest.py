"""Shared fixtures: a tiny random-weight Llama for fast tests, the real model for integration tests."""

from __future__ import annotations

import pytest
from tiny_models import tiny_llama, tiny_llama_config  # noqa: F401  (re-exported for fixtures)


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


@pytest.fixture(autouse=True, scope="session")
def _no_model_hub():
    """No test may need a model hub: make any attempt fail fast instead of hanging."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
