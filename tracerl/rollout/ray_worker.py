"""The process side of a Ray rollout worker: :class:`RolloutWorker`, made a Ray actor by
:mod:`tracerl.rollout.ray_executor` (this module does not import Ray, so it runs and tests as a plain
object too). It holds one :class:`~tracerl.rollout.executor.LocalExecutor` built from a
:class:`~tracerl.rollout.worker_spec.WorkerSpec` by the spec's builder; model code is imported
here, in the worker, never on the driver side of the executor.

A worker on another node reads the run's files at the paths the driver names (the initial policy,
the data files). One that cannot read one, or whose build fails for a reason the user can fix,
builds nothing and says so in one line (:meth:`RolloutWorker.refusal`); the executor then stops
the run with that line before the first step.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import replace
from typing import Any

from tracerl.errors import one_line
from tracerl.rollout.weight_sync import sync_group, sync_store, unpack
from tracerl.rollout.worker_spec import WorkerSpec

DATA_PATHS = ("tasks", "corpus", "eval_tasks")
"""``data`` fields naming files every worker reads (its environment and evaluation tasks)."""


def with_absolute_paths(spec: WorkerSpec) -> WorkerSpec:
    """``spec`` with relative data paths made absolute from this (the driver's) working directory:
    a worker runs in a directory of its own, where ``data/train.jsonl`` names nothing."""
    data = dict(spec.config.get("data", {}) or {})
    for key in DATA_PATHS:
        value = data.get(key)
        if value and not os.path.isabs(str(value)) and os.path.exists(str(value)):
            data[key] = os.path.abspath(str(value))
    return replace(spec, config={**spec.config, "data": data})


def unreadable(spec: WorkerSpec) -> str | None:
    """The first file or folder of ``spec`` this process cannot read, as ``what = path``; None when
    all can be read. The initial policy is checked when it is a path (a hub name is not)."""
    checks = []
    if os.path.isabs(spec.initial_policy):
        checks.append(("the initial policy", spec.initial_policy))
    data = spec.config.get("data", {}) or {}
    checks += [(f"data.{key}", str(data[key])) for key in DATA_PATHS if data.get(key)]
    for what, path in checks:
        if not os.access(path, os.R_OK):
            return f"{what} = {path}"
    return None


class RolloutWorker:
    """The actor: one :class:`LocalExecutor` built from ``spec`` (``rollout.executor`` set to local)."""

    def __init__(self, spec: WorkerSpec, weight_sync: str = "object_store") -> None:
        from tracerl.models.threads import set_threads

        rollout = {**spec.config["rollout"], "executor": "local", "workers": 1}
        spec = replace(spec, config={**spec.config, "rollout": rollout})
        set_threads(spec.config["model"].get("threads", 0), spec.config["model"].get("device", "cpu"))
        self._refusal: str | None = None
        self.executor: Any = None
        missing = unreadable(spec)
        if missing is not None:
            self._refusal = f"cannot read {missing}"
        else:
            try:
                self.executor = spec.builder()(spec)
            except Exception as exc:  # noqa: BLE001 - a user-fixable failure becomes the refusal; bugs raise
                line = one_line(exc)
                if line is None:
                    raise
                self._refusal = line
        self.where = f"{spec.worker} on {socket.gethostname()}"
        self.weight_sync = weight_sync
        self._store: Any = None  # the driver's weight-sync store (nccl), once joined
        self._group: Any = None
        self.device = str(spec.config["model"].get("device", "cpu"))
        self._die_in: str | None = None
        self._hang_in: str | None = None

    def call(self, method: str, *args: Any) -> Any:
        if self._die_in == method:  # a test's fault: this process ends in the middle of the call
            os.kill(os.getpid(), signal.SIGKILL)
        if self._hang_in == method:  # a test's fault: the call never answers
            time.sleep(3600)
        return getattr(self.executor, method)(*args)

    def load(self, payload: Any, mode: str) -> int:
        """One streamed part of a weight sync (the version stays until :meth:`end_sync`); the number
        of tensors loaded."""
        buckets = unpack(payload, mode, self.device, self._group)
        self.executor.sync_weights(buckets, self.executor.version)
        return sum(len(bucket) for bucket in buckets)

    def end_sync(self, version: int) -> None:
        """Every part is loaded: the weights are ``version`` (prefix caches cleared again)."""
        self.executor.sync_weights([], version)

    def join_group(self, host: str, port: int, generation: int, world: int, rank: int, backend: str,
                   timeout_s: float) -> None:
        """Join generation ``generation`` of the weight-sync group (the driver is rank 0); the
        previous generation is dropped."""
        if self._store is None:
            self._store = sync_store(host, port, timeout_s)
        self._group = None
        self._group = sync_group(self._store, backend, generation, rank, world, timeout_s)

    def parameters(self) -> dict[str, Any]:
        """The backend model's state (tests compare it with the trainer's)."""
        return {k: v.detach().cpu().clone() for k, v in self.executor.backend.model.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def refusal(self) -> str | None:
        """Why this worker built nothing (one line naming it, its node and the cause), or None."""
        return None if self._refusal is None else f"rollout worker {self.where}: {self._refusal}"

    def die_in(self, method: str | None) -> None:
        """Fault injection for tests: SIGKILL this process when ``method`` is next called."""
        self._die_in = method

    def hang_in(self, method: str | None) -> None:
        """Fault injection for tests: never answer the next ``method`` call."""
        self._hang_in = method
