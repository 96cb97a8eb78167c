"""Parquet task and corpus files (the optional ``datasets`` extra: pyarrow) and their absence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.envs import data as data_module
from tracerl.envs.convert import convert
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.errors import UserError
from tracerl.config.schema import ConfigError, resolve_config

RAW = Path(__file__).parents[1] / "data" / "raw"
HOTPOT = Path(__file__).parents[1] / "data" / "hotpotqa"


def _write_parquet(rows: list[dict], path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_file_without_the_extra_fails_at_config_load(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tracerl.config.schema.parquet_available", lambda: False)
    tasks = tmp_path / "tasks.parquet"
    tasks.write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match=r"data.tasks = .*tasks.parquet.*pip install -e '\.\[datasets\]'"):
        resolve_config("grpo", overrides=["data.source=files", f"data.tasks={tasks}",
                                          f"data.corpus={HOTPOT / 'corpus.jsonl'}"])
    monkeypatch.setattr(data_module, "parquet_available", lambda: False)
    with pytest.raises(UserError, match=r"tasks.parquet: reading .parquet files needs pyarrow"):
        load_tasks(tasks)


def test_json_list_files_load_like_jsonl(tmp_path) -> None:
    rows = [json.loads(line) for line in (HOTPOT / "tasks.jsonl").read_text(encoding="utf-8").splitlines()]
    (tmp_path / "tasks.json").write_text(json.dumps(rows), encoding="utf-8")
    assert load_tasks(tmp_path / "tasks.json") == load_tasks(HOTPOT / "tasks.jsonl")
    (tmp_path / "bad.json").write_text(json.dumps([rows[0], {"id": "x"}]), encoding="utf-8")
    with pytest.raises(UserError, match=r"bad.json\[1\]: missing field 'question'"):
        load_tasks(tmp_path / "bad.json")


@pytest.mark.extras
def test_parquet_tasks_and_corpus_load_like_jsonl(tmp_path) -> None:
    for name, load in (("tasks", load_tasks), ("corpus", load_corpus)):
        rows = [json.loads(line) for line in (HOTPOT / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        path = _write_parquet(rows, tmp_path / f"{name}.parquet")
        assert load(path) == load(HOTPOT / f"{name}.jsonl")
    config = resolve_config("grpo", overrides=["data.source=files", f"data.tasks={tmp_path / 'tasks.parquet'}",
                                               f"data.corpus={tmp_path / 'corpus.parquet'}"])
    assert config.data.tasks.endswith(".parquet")


@pytest.mark.extras
def test_search_r1_parquet_converts_like_its_jsonl(tmp_path) -> None:
    rows = [json.loads(line) for line in (RAW / "search_r1_sample.jsonl").read_text(encoding="utf-8").splitlines()]
    rows[1]["id"] = None  # parquet needs one schema: a missing column becomes a null
    _write_parquet(rows, tmp_path / "train.parquet")
    a = convert("search-r1", tmp_path / "train.parquet", tmp_path / "a")
    b = convert("search-r1", RAW / "search_r1_sample.jsonl", tmp_path / "b")
    assert a.tasks == b.tasks == 5 and a.errors == b.errors == []
    assert load_tasks(tmp_path / "a" / "tasks.jsonl") == load_tasks(tmp_path / "b" / "tasks.jsonl")


def test_train_with_parquet_and_no_extra_ends_in_one_line_and_no_run_folder(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from tracerl.cli import app

    monkeypatch.setattr("tracerl.config.schema.parquet_available", lambda: False)
    tasks = tmp_path / "tasks.parquet"
    tasks.write_bytes(b"PAR1")
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(tmp_path / "run"),
                                      "--set", "data.source=files", "--set", f"data.tasks={tasks}",
                                      "--set", f"data.corpus={HOTPOT / 'corpus.jsonl'}"])
    assert result.exit_code != 0 and not (tmp_path / "run").exists()
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train failed: ") and "pip install -e '.[datasets]'" in lines[0]
