"""Bad data files name file and line; empty files and repeated ids fail at load; the trainer's
environment gets the configured tool timeout and counts tool calls across worlds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.core.types import Action, Task
from tracerl.envs.base import ToolEnvironment
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.envs.tools import ToolSet
from tracerl.errors import UserError
from tracerl.rollout.engine import EngineConfig
from tracerl.config.schema import DataConfig
from tracerl.train.data import RoutedEnvironment, check_task_files, load_task_data

LINE = '{{"id": "{i}", "question": "Who is {i}?", "answers": ["A{i}"]}}\n'
DOC = '{{"id": "d{i}", "title": "Page {i}", "text": "Page {i} says A{i}."}}\n'


def write(path: Path, template: str, ids: list[int]) -> Path:
    path.write_text("".join(template.format(i=i) for i in ids), encoding="utf-8")
    return path


def test_non_utf8_bytes_are_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(LINE.format(i=1).encode() + b'{"id": "2", "question": "Caf\xe9?", "answers": ["A"]}\n')
    with pytest.raises(UserError, match=r"tasks.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 29\)"):
        load_tasks(path)
    path.write_bytes(b"\xef\xbb\xbf" + LINE.format(i=1).encode())  # a byte-order mark is fine
    assert [t.id for t in load_tasks(path)] == ["1"]


def test_empty_files_are_errors(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("\n  \n")
    with pytest.raises(UserError, match="t.jsonl: no tasks"):
        load_tasks(tmp_path / "t.jsonl")
    with pytest.raises(UserError, match="t.jsonl: no documents"):
        load_corpus(tmp_path / "t.jsonl")


def files_config(tmp_path: Path, train: list[int], held_out: list[int] | None = None, **extra: object) -> DataConfig:
    tasks = write(tmp_path / "train.jsonl", LINE, train)
    corpus = write(tmp_path / "corpus.jsonl", DOC, [1, 2, 3])
    eval_tasks = str(write(tmp_path / "eval.jsonl", LINE, held_out)) if held_out is not None else ""
    return DataConfig(source="files", tasks=str(tasks), corpus=str(corpus), eval_tasks=eval_tasks, **extra)  # type: ignore[arg-type]


def test_eval_ids_that_repeat_training_ids_are_rejected(tmp_path: Path) -> None:
    config = files_config(tmp_path, [1, 2, 3, 4, 5, 6, 7], held_out=[9, 3, 5, 6, 7, 2, 1])
    with pytest.raises(UserError, match=r"repeats ids of data.tasks .*'1', '2', '3', '5', '6' \(\+1 more\)"):
        check_task_files(config)
    with pytest.raises(UserError, match="held-out ids must differ"):
        load_task_data(config, EngineConfig(), seed=0)
    check_task_files(files_config(tmp_path, [1, 2], held_out=[3]))  # disjoint ids load


def test_a_single_task_file_without_eval_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs at least 2"):
        check_task_files(files_config(tmp_path, [1]))


def test_trainer_environment_gets_the_configured_tool_timeout(tmp_path: Path) -> None:
    data = load_task_data(files_config(tmp_path, [1, 2, 3], held_out=[4], tool_timeout_s=2.5), EngineConfig(), seed=0)
    episode = data.environment.start(data.train[0])
    assert episode.config.tool_timeout_s == 2.5
    episode.step(Action(kind="tool", name="search", arguments={"query": "Page 1"}))
    data.environment.start(data.held_out[0]).step(Action(kind="tool", name="search", arguments={"query": "x"}))
    stats = data.environment.take_tool_stats()
    assert (stats.calls, stats.failures) == (2, 0)
    assert data.environment.take_tool_stats().calls == 0
    off = load_task_data(files_config(tmp_path, [1, 2, 3], held_out=[4], tool_timeout_s=None), EngineConfig(), seed=0)
    assert off.environment.start(off.train[0]).config.tool_timeout_s is None


def echo(query: str) -> str:
    """Echo."""
    return query


def test_routed_tool_stats_sum_every_registered_environment() -> None:
    routed = RoutedEnvironment()
    first, second = ToolEnvironment(ToolSet([echo])), ToolEnvironment(ToolSet([echo]))
    routed.register([Task("a", "Q?", ("A",))], first)
    routed.register([Task("b", "Q?", ("B",))], second)
    routed.register([Task("c", "Q?", ("C",))], first)  # counted once
    for task in ("a", "b", "c"):
        routed.start(Task(task, "Q?", ("A",))).step(Action(kind="tool", name="echo", arguments={"query": "q"}))
    assert routed.take_tool_stats().calls == 3
    assert routed.take_tool_stats().calls == 0
