"""Shared test setup: offline hub, caches inside the test session's tmp dir."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRACERL_THREADS", "1")  # runs set torch threads from it (models/threads.py)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tracerl's and Hugging Face's caches out of the user's home, and debug mode off, during tests."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("HF_HOME", str(cache / "hf"))
    # Errors are asserted as the user sees them (one line): a developer's TRACERL_DEBUG=1 would
    # turn them into tracebacks.
    monkeypatch.delenv("TRACERL_DEBUG", raising=False)


# Tiny models decode fastest on one thread; with two busy cores, two threads were 40x slower per step.
import torch  # noqa: E402

torch.set_num_threads(1)
