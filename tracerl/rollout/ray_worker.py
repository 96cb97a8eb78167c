"""The process side of a Ray rollout worker: :class:`RolloutWorker`, made a Ray actor by
:mod:`tracerl.rollout.ray_executor` (this module does not import Ray, so it runs and tests as a plain
object too). It holds one :class:`~tracerl.rollout.executor.LocalExecutor` built from a
:class:`~tracerl.rollout.worker_spec.WorkerSpec` by the spec's builder; model code is imported
here, in the worker, never on the driver side of the executor.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from typing import Any

from tracerl.rollout.weight_sync import unpack
from tracerl.rollout.worker_spec import WorkerSpec


class RolloutWorker:
    """The actor: one :class:`LocalExecutor` built from ``spec`` (``rollout.executor`` set to local)."""

    def __init__(self, spec: WorkerSpec, weight_sync: str = "object_store") -> None:
        from tracerl.models.threads import set_threads

        rollout = {**spec.config["rollout"], "executor": "local", "workers": 1}
        spec = replace(spec, config={**spec.config, "rollout": rollout})
        set_threads(spec.config["model"].get("threads", 0), spec.config["model"].get("device", "cpu"))
        self.executor = spec.builder()(spec)
        self.weight_sync = weight_sync
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
        buckets = unpack(payload, mode, self.device)
        self.executor.sync_weights(buckets, self.executor.version)
        return sum(len(bucket) for bucket in buckets)

    def end_sync(self, version: int) -> None:
        """Every part is loaded: the weights are ``version`` (prefix caches cleared again)."""
        self.executor.sync_weights([], version)

    def join_group(self, address: str, world: int, rank: int) -> None:
        """Join the ``nccl`` weight-sync group (the driver is rank 0)."""
        import torch.distributed as dist

        dist.init_process_group("nccl", init_method=address, world_size=world, rank=rank)

    def parameters(self) -> dict[str, Any]:
        """The backend model's state (tests compare it with the trainer's)."""
        return {k: v.detach().cpu().clone() for k, v in self.executor.backend.model.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def die_in(self, method: str | None) -> None:
        """Fault injection for tests: SIGKILL this process when ``method`` is next called."""
        self._die_in = method

    def hang_in(self, method: str | None) -> None:
        """Fault injection for tests: never answer the next ``method`` call."""
        self._hang_in = method
