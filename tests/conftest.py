"""Shared fixtures: the bundled model (loaded once per session) and a tiny synthetic GGUF."""
from __future__ import annotations

import pytest
from hypothesis import settings

import gpu_children
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GPU suites' modules last (each module's own order kept): their children then run
    beside the rest of the suite instead of the suite waiting on them midway."""
    items.sort(key=lambda item: hasattr(getattr(item, "module", None), "early_children"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the GPU suites' child processes the selected tests need, now, at nice 19: they
    run on the time the rest of the suite leaves a core idle (tests/gpu_children.py)."""
    if session.config.option.collectonly:
        return
    selected: dict[object, list[pytest.Item]] = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "early_children"):
            selected.setdefault(module, []).append(item)
    for module, items in selected.items():
        for key, env in module.early_children(items):  # type: ignore[attr-defined]
            gpu_children.start(module.__file__, key, env)  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    gpu_children.stop_all()
