"""Joining or starting the Ray cluster of the rollout workers, and whether it can hold them.

Used by :class:`~tracerl.rollout.ray_executor.RayExecutor` (imports Ray).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import ray

from tracerl.errors import UserError


def check_placeable(bundle: Mapping[str, float], count: int, total: Mapping[str, float]) -> None:
    """Refuse, in one line, workers the cluster can never hold: ``count`` bundles of ``bundle``
    against the cluster's ``total`` resources (``ray.cluster_resources()``). Without this a
    placement group that cannot be placed waits out ``rollout.request_timeout_s`` (600 s)."""
    for key, need in bundle.items():
        have = float(total.get(key, 0.0))
        if need * count > have:
            field = "gpus" if key == "GPU" else "cpus"
            raise UserError(f"rollout.workers = {count} x rollout.worker_resources.{field} = {need:g} needs "
                            f"{need * count:g} {key}, but the Ray cluster has {have:g} {key} in all; lower one of "
                            "them or join a cluster that has them (rollout.ray_address)")


def free_resources() -> str:
    free = ray.available_resources()
    return ", ".join(f"{k} {free[k]:g}" for k in ("CPU", "GPU") if k in free) or "nothing"


def connect(address: str, cpus: float) -> bool:
    """Join ``address`` (or the cluster this process is already connected to), or start a local
    cluster with room for the workers; whether a cluster was started here.

    Without an address a new local cluster is started (``address="local"``): a plain
    ``ray.init()`` would attach to whatever cluster Ray's ``ray_current_cluster`` file names, a
    stale or a foreign one, and then refuse the CPU count."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    ray.init(address="local", num_cpus=max(int(cpus + 0.999), os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False)
    return True
