"""Shared fixtures. Tests never touch the network and never reuse the user's caches."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Lenses, frequency tables and results of a test session live in a fresh folder,
    so a green run never depends on something a developer cached by hand."""
    if "DEPTHKIT_TEST_KEEP_CACHE" not in os.environ:
        os.environ["DEPTHKIT_CACHE"] = str(tmp_path_factory.mktemp("depthkit-cache"))
    os.environ["DEPTHKIT_RESULTS"] = str(tmp_path_factory.mktemp("depthkit-results"))
    yield


@pytest.fixture(scope="session")
def tiny_models():
    import depthkit as dk

    return {arch: dk.load_model(f"tiny-{arch}", seed=0) for arch in ("llama", "gpt2", "neox", "gemma3")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def smollm2():
    import depthkit as dk

    return dk.load_model("smollm2-135m")
