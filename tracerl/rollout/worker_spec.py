""":class:`WorkerSpec`: what a rollout worker in another process is built from, as plain data.

The execution wing never reads the training config's schema: a spec carries the run's config as
a plain dict (the Ray executor reads only its ``rollout`` section) and the import path of the
function that turns a spec into a :class:`~tracerl.rollout.executor.LocalExecutor`. The trainer
fills both in (:func:`tracerl.train.executors.worker_spec`); a worker process imports the builder
by its path (:meth:`WorkerSpec.builder`), so a driver that only plans and dispatches loads no model
code, and a test or another framework can hand in a builder of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracerl.core.registry import resolve_import_path


@dataclass
class WorkerSpec:
    """What a rollout worker is built from (plain data: picklable and JSON-able)."""

    config: dict[str, Any]
    """The run's config as plain data; ``config["rollout"]`` holds the executor's settings
    (``workers``, ``weight_sync``, ``request_timeout_s``, ...)."""
    initial_policy: str
    """Folder (or hub name) of the initial policy: loaded by a worker that holds no model."""
    build: str
    """Import path (``package.module:function``) of ``function(spec) -> LocalExecutor``."""
    seed: int = 0
    worker: str = "local"
    """The executor's name in results and errors."""
    version: int = 0
    """Weights version the worker starts with (the step it is built at)."""

    def builder(self) -> Callable[[WorkerSpec], Any]:
        """The function :attr:`build` names (imported here, in the worker's process)."""
        build = resolve_import_path(self.build, "rollout worker builder")
        if not callable(build):
            raise TypeError(f"rollout worker builder {self.build!r} is not callable")
        return build  # type: ignore[return-value]
