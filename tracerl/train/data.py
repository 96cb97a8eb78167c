"""Training and evaluation tasks with the environment that serves them.

SynthWiki training draws several worlds from one name seed and different fact seeds, so the
policy has to read its observations instead of memorising one world (a prototype's accuracy
fell from 93% to 12% when the facts of its single training world were re-drawn). Each world
has its own search index; :class:`RoutedEnvironment` sends each task to its world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from tracerl.core.types import Task
from tracerl.envs.base import ToolEnvironment
from tracerl.envs.data import Document, load_corpus, load_tasks
from tracerl.envs.search import search_environment
from tracerl.envs.synthwiki import build_world
from tracerl.rollout.engine import EngineConfig
from tracerl.train.config import DataConfig


class RoutedEnvironment:
    """An environment over several corpora: a task runs in the environment it was registered with."""

    def __init__(self) -> None:
        self._by_task: dict[str, ToolEnvironment] = {}
        self.tools: Any = None

    def register(self, tasks: list[Task], env: ToolEnvironment) -> None:
        if self.tools is None:
            self.tools = env.tools  # every world exposes the same tool names and signatures
        for task in tasks:
            self._by_task[task.id] = env

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


def _world_env(documents: list[Document], data: DataConfig, engine: EngineConfig) -> ToolEnvironment:
    return search_environment(documents, data.search_top_k, engine)  # the factory evaluation uses too


def load_task_data(data: DataConfig, engine: EngineConfig, seed: int) -> TaskData:
    """Build worlds (or read files) and register every task with its environment."""
    routed = RoutedEnvironment()
    if data.source == "files":
        tasks, docs = load_tasks(data.tasks), load_corpus(data.corpus)
        env = _world_env(docs, data, engine)
        if data.eval_tasks:
            held_out = load_tasks(data.eval_tasks)
        else:  # no held-out file: keep the last tenth of the training file aside
            cut = max(1, len(tasks) // 10)
            tasks, held_out = tasks[:-cut], tasks[-cut:]
        routed.register(tasks + held_out, env)
        return TaskData(_shuffled(tasks, data, seed), held_out, [], routed, docs)
    train: list[Task] = []
    first_docs: list[Document] = []
    for offset in range(data.train_worlds):
        world = build_world(replace(data.world, fact_seed=data.first_fact_seed + offset))
        routed.register(world.train, _world_env(world.documents, data, engine))
        train += world.train
        first_docs = first_docs or world.documents
    unseen = build_world(replace(data.world, fact_seed=data.eval_fact_seed))
    routed.register(unseen.test, _world_env(unseen.documents, data, engine))
    redrawn = build_world(replace(data.world, fact_seed=data.redrawn_fact_seed))
    routed.register(redrawn.train, _world_env(redrawn.documents, data, engine))
    return TaskData(_shuffled(train, data, seed), unseen.test, redrawn.train, routed, first_docs)


def _shuffled(tasks: list[Task], data: DataConfig, seed: int) -> list[Task]:
    if not tasks:
        raise ValueError("no training tasks: check data.world.num_train or the tasks file")
    if data.shuffle:
        tasks = list(tasks)
        random.Random(f"tracerl-data:{seed}").shuffle(tasks)
    return tasks


def take_pool(tasks: list[Task], cursor: int, size: int) -> list[Task]:
    """``size`` tasks from ``cursor`` on, wrapping around the (fixed) shuffled order."""
    return [tasks[(cursor + i) % len(tasks)] for i in range(size)]
