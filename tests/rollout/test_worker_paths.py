"""What a Ray rollout worker checks before it builds: the run's files at the driver's paths
(tracerl.rollout.ray_worker imports no Ray: these run in the default suite)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracerl.rollout.ray_worker import unreadable, with_absolute_paths
from tracerl.rollout.worker_spec import WorkerSpec


def _spec(initial: str, **data: str) -> WorkerSpec:
    return WorkerSpec({"data": data, "rollout": {}, "model": {}}, initial, "x:y")


def test_the_first_unreadable_path_is_named(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("{}\n")
    assert unreadable(_spec(str(tmp_path), corpus=str(corpus))) is None
    assert unreadable(_spec("org/model", corpus=str(corpus))) is None  # a hub name is not a path
    assert unreadable(_spec(str(tmp_path / "gone"), corpus=str(corpus))) == f"the initial policy = {tmp_path / 'gone'}"
    assert unreadable(_spec(str(tmp_path), corpus=str(corpus), tasks="/nowhere/t.jsonl")) == \
        "data.tasks = /nowhere/t.jsonl"


def test_relative_data_paths_become_the_drivers_absolute_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    spec = with_absolute_paths(_spec("/abs/initial", tasks="data/train.jsonl", corpus="missing.jsonl"))
    assert spec.config["data"] == {"tasks": os.path.join(os.getcwd(), "data", "train.jsonl"),
                                   "corpus": "missing.jsonl"}  # what the driver cannot see stays as given
