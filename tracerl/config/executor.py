"""Settings of distributed rollout executors (``rollout.executor = ray``) and their checks.

Kept apart from :mod:`tracerl.config.schema` so the shared config file only gains the fields; the
checks run at config load, so a bad value (or Ray missing) is one line naming the field before
anything is built. Nothing here imports Ray: it is looked up with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from tracerl.config.loading import ConfigError

EXECUTORS = ("local", "ray")
"""Values of ``rollout.executor``."""
WEIGHT_SYNCS = ("object_store", "cuda_ipc", "nccl")
"""Values of ``rollout.weight_sync``: how new weights reach Ray rollout workers."""
READINESS_ON = ("driver", "workers", "scoring_workers")
"""Values of ``rollout.readiness_on``: where reference readiness is scored."""
RAY_INSTALL = "pip install -e '.[ray]' from a checkout"


@dataclass
class WorkerResources:
    """What one Ray rollout worker reserves in the placement group (a bundle)."""

    cpus: float = 1.0
    """CPU cores per worker (Ray's logical CPUs: what the scheduler reserves, not a limit on threads)."""
    gpus: float = 0.0
    """GPUs per worker; fractions share one GPU between workers (Ray's fractional resources)."""

    def __post_init__(self) -> None:
        if not self.cpus > 0:
            raise ConfigError(f"rollout.worker_resources.cpus must be > 0, got {self.cpus}")
        if not self.gpus >= 0:
            raise ConfigError(f"rollout.worker_resources.gpus must be >= 0, got {self.gpus}")

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle (zero amounts left out)."""
        return {k: v for k, v in (("CPU", float(self.cpus)), ("GPU", float(self.gpus))) if v > 0}


def check_rollout_executor(rollout: Any) -> None:
    """The executor fields of a ``RolloutConfig``; with ``ray``, Ray must be installed."""
    for name, allowed in (("executor", EXECUTORS), ("weight_sync", WEIGHT_SYNCS), ("readiness_on", READINESS_ON)):
        value = getattr(rollout, name)
        if value not in allowed:
            raise ConfigError(f"rollout.{name} = {value!r} is not valid; allowed values: {', '.join(allowed)}")
    for name in ("workers", "scoring_workers", "sync_bucket_mb"):
        value = getattr(rollout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"rollout.{name} must be an integer >= 1, got {value!r}")
    if isinstance(rollout.max_worker_restarts, bool) or not isinstance(rollout.max_worker_restarts, int) \
            or rollout.max_worker_restarts < 0:
        raise ConfigError(f"rollout.max_worker_restarts must be an integer >= 0, got {rollout.max_worker_restarts!r}")
    if not rollout.request_timeout_s > 0:
        raise ConfigError(f"rollout.request_timeout_s must be > 0 seconds, got {rollout.request_timeout_s}")
    if rollout.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(f"rollout.executor = 'ray' needs Ray, which is not installed: {RAY_INSTALL}")
    if rollout.executor == "local" and rollout.workers != 1:
        raise ConfigError(f"rollout.workers = {rollout.workers} needs rollout.executor = 'ray' "
                          "(the local executor is one in-process worker)")


def check_weight_sync(config: Any) -> None:
    """``cuda_ipc`` and ``nccl`` move CUDA tensors: refused unless the policy is on an available GPU."""
    rollout = config.rollout
    if rollout.executor != "ray" or rollout.weight_sync == "object_store":
        return
    import torch

    if not str(config.model.device).startswith("cuda") or not torch.cuda.is_available():
        raise ConfigError(f"rollout.weight_sync = {rollout.weight_sync!r} needs model.device = 'cuda' on a machine "
                          f"with CUDA (model.device = {config.model.device!r}); use rollout.weight_sync = 'object_store'")
    if rollout.worker_resources.gpus <= 0:
        raise ConfigError(f"rollout.weight_sync = {rollout.weight_sync!r} needs GPU workers: "
                          "set rollout.worker_resources.gpus > 0")
