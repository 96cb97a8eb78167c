"""Training and evaluation tasks with the environment that serves them.

SynthWiki training draws several worlds from one name seed and different fact seeds, so the
policy has to read its observations instead of memorising one world (a prototype's accuracy
fell from 93% to 12% when the facts of its single training world were re-drawn). Each world
has its own search index; :class:`RoutedEnvironment` sends each task to its world.

Task ids are the keys of that routing (and of the trainer's task table), so they must be
unique across everything a run loads: a held-out file that repeats a training id is rejected
at load (see :func:`check_task_files`) rather than namespaced, because a repeated id is
most often the same question, i.e. a held-out set that leaks the training set.

``files`` data is read by :mod:`tracerl.envs.data`: ``.jsonl``, a ``.json`` list, or
``.parquet`` with the optional ``datasets`` extra (pyarrow, imported only for such a file).
``tracerl data convert`` (:mod:`tracerl.envs.convert`) writes these files from raw data sets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from tracerl.core.types import Task
from tracerl.core.registry import RegistryError
from tracerl.envs.base import ToolEnvironment, env_config
from tracerl.envs.data import Document, load_corpus, load_tasks
from tracerl.envs.health import ToolStats
from tracerl.envs.environments import EnvSettings, build_environment
from tracerl.envs.synthwiki import build_world
from tracerl.rollout.engine import EngineConfig
from tracerl.errors import UserError
from tracerl.config.schema import DataConfig


class RoutedEnvironment:
    """An environment over several corpora: a task runs in the environment it was registered with."""

    def __init__(self) -> None:
        self._by_task: dict[str, ToolEnvironment] = {}
        self._envs: list[ToolEnvironment] = []
        self.tools: Any = None

    def register(self, tasks: list[Task], env: ToolEnvironment) -> None:
        """Route ``tasks`` to ``env`` (registering a task again moves it; loading keeps ids unique)."""
        if self.tools is None:
            self.tools = env.tools  # every world exposes the same tool names and signatures
        if not any(e is env for e in self._envs):
            self._envs.append(env)
        for task in tasks:
            self._by_task[task.id] = env

    def take_tool_stats(self) -> ToolStats:
        """Tool calls and failures of every environment since the last take (resets them)."""
        total = ToolStats()
        for env in self._envs:
            total = total + env.stats.take()
        return total

    def start(self, task: Task) -> Any:
        try:
            env = self._by_task[task.id]
        except KeyError:
            raise KeyError(f"task {task.id!r} belongs to no registered environment") from None
        return env.start(task)


@dataclass
class TaskData:
    """What a run trains and evaluates on."""

    train: list[Task]
    held_out: list[Task]
    """Questions of an unseen world (SynthWiki) or the held-out file."""
    redrawn: list[Task]
    """Training-split questions of a world with re-drawn facts (empty for file data)."""
    environment: RoutedEnvironment
    documents: list[Document]
    """Documents of the first training world (vocabulary for a randomly initialised tiny model)."""


def run_environment(documents: list[Document], data: DataConfig, engine: EngineConfig) -> ToolEnvironment:
    """``data.environment`` over ``documents`` plus ``data.tools`` (envs/environments.py): the one
    place a run's environment is built (training, and ``tracerl eval --run`` on other files)."""
    settings = EnvSettings(data.search_top_k, env_config(engine, data.tool_timeout_s),
                           data.retriever_url, data.retriever_retries)
    try:
        return build_environment(data.environment, documents, settings, data.tools, data.isolate_tools)
    except RegistryError as err:
        raise UserError(str(err)) from None


def _some(ids: list[str], shown: int = 5) -> str:
    more = f" (+{len(ids) - shown} more)" if len(ids) > shown else ""
    return ", ".join(repr(i) for i in ids[:shown]) + more


def _read_files(data: DataConfig) -> tuple[list[Task], list[Task], list[Document]]:
    """(training tasks, held-out tasks, corpus) of ``files`` data, checked as a whole."""
    limits = {"max_line_bytes": data.max_line_bytes, "max_question_chars": data.max_question_chars}
    tasks = load_tasks(data.tasks, **limits)
    # http_search: the server holds the corpus; a given one is read for the tokenizer checks only
    docs = load_corpus(data.corpus, max_line_bytes=data.max_line_bytes) if data.corpus else []
    if data.eval_tasks:
        held_out = load_tasks(data.eval_tasks, **limits)
        train_ids = {t.id for t in tasks}
        repeated = sorted({t.id for t in held_out if t.id in train_ids})
        if repeated:
            raise UserError(f"data.eval_tasks {data.eval_tasks} repeats ids of data.tasks {data.tasks}: "
                            f"{_some(repeated)}; held-out ids must differ from training ids")
    else:  # no held-out file: keep the last tenth of the training file aside
        if len(tasks) < 2:
            raise UserError(f"data.tasks {data.tasks} holds {len(tasks)} task; with no data.eval_tasks a tenth "
                            "of it is held out, so it needs at least 2")
        cut = max(1, len(tasks) // 10)
        tasks, held_out = tasks[:-cut], tasks[-cut:]
    return tasks, held_out, docs


def check_task_files(data: DataConfig) -> None:
    """Read and check ``files`` data (UTF-8, JSON, fields, non-empty, unique ids) without indexing it.

    The command line calls this before it creates a run folder, so bad data fails with one
    line and leaves nothing behind. SynthWiki data is generated and needs no check.
    """
    if data.source == "files":
        _read_files(data)


def load_task_data(data: DataConfig, engine: EngineConfig, seed: int) -> TaskData:
    """Build worlds (or read files) and register every task with its environment."""
    routed = RoutedEnvironment()
    if data.source == "files":
        tasks, held_out, docs = _read_files(data)
        routed.register(tasks + held_out, run_environment(docs, data, engine))
        return TaskData(_shuffled(tasks, data, seed), held_out, [], routed, docs)
    train: list[Task] = []
    first_docs: list[Document] = []
    for offset in range(data.train_worlds):
        world = build_world(replace(data.world, fact_seed=data.first_fact_seed + offset))
        routed.register(world.train, run_environment(world.documents, data, engine))
        train += [t for t in world.train if not data.train_hops or t.hops in data.train_hops]
        first_docs = first_docs or world.documents
    unseen = build_world(replace(data.world, fact_seed=data.eval_fact_seed))
    routed.register(unseen.test, run_environment(unseen.documents, data, engine))
    redrawn = build_world(replace(data.world, fact_seed=data.redrawn_fact_seed))
    routed.register(redrawn.train, run_environment(redrawn.documents, data, engine))
    return TaskData(_shuffled(train, data, seed), unseen.test, redrawn.train, routed, first_docs)


def _shuffled(tasks: list[Task], data: DataConfig, seed: int) -> list[Task]:
    if not tasks:
        raise UserError("no training tasks: check data.world.num_train or the tasks file")
    if data.shuffle:
        tasks = list(tasks)
        random.Random(f"tracerl-data:{seed}").shuffle(tasks)
    return tasks


def take_pool(tasks: list[Task], cursor: int, size: int) -> list[Task]:
    """``size`` tasks from ``cursor`` on, wrapping around the (fixed) shuffled order."""
    return [tasks[(cursor + i) % len(tasks)] for i in range(size)]
