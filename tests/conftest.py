"""Shared fixtures: the bundled model (loaded once per session) and a tiny synthetic GGUF."""
from __future__ import annotations

import pytest
from hypothesis import settings

from tiny_gguf import write_tiny_llama

# Tests check behaviour, never wall-clock time: Hypothesis's default 200 ms deadline per
# example fails property tests at random on a shared, loaded machine.
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")


@pytest.fixture(scope="session")
def model_path() -> str:
    # No skip: the bootstrap installs the model, and a test suite that silently skips the
    # model tests when it is missing would pass while testing nothing.
    from zerolayer.gpu.gguf_loader import default_model_path
    return default_model_path()


@pytest.fixture(scope="session")
def generator(model_path):
    from zerolayer.gpu.generate import Generator
    return Generator.load(model_path, max_seq_len=2048)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_llama(str(path))
    return str(path)
