"""Shared test setup: offline hub, caches inside the test session's tmp dir."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRACERL_THREADS", "1")  # runs set torch threads from it (models/threads.py)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tracerl's and Hugging Face's caches out of the user's home during tests."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("HF_HOME", str(cache / "hf"))


# Tiny models decode fastest on one thread; with two busy cores, two threads were 40x slower per step.
import torch  # noqa: E402

torch.set_num_threads(1)
