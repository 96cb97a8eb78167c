"""How many torch intra-op threads a CPU run uses, and why it is set explicitly.

torch defaults to one thread per physical core of the machine, whatever else runs on it.
On a shared or loaded machine those threads spin against other processes: pretraining the
tiny model took 358 s with one thread but about 41 minutes (projected) with the default count
under load. So a run sets the count from ``model.threads``, else ``$TRACERL_THREADS``, else the
cores this process may use (``os.sched_getaffinity``: a container or ``taskset`` limit counts).
"""

from __future__ import annotations

import os

import torch

ENV_VAR = "TRACERL_THREADS"
MAX_THREADS = 4096
"""More intra-op threads than any machine has cores is a typo (``1e20``, a pasted number)."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(setting: int = 0) -> int:
    """``setting`` when > 0, else ``$TRACERL_THREADS``, else :func:`available_cores`.

    A ``TRACERL_THREADS`` that is not a positive integer is a ``ValueError`` naming it.
    """
    if setting > 0:
        return setting
    raw = os.environ.get(ENV_VAR, "").strip()
    if raw:
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_THREADS:
            raise ValueError(f"{ENV_VAR}={raw[:40]!r} must be an integer from 1 to {MAX_THREADS} (torch intra-op threads)")
        return int(raw)
    return available_cores()


def set_threads(setting: int = 0, device: str = "cpu") -> int | None:
    """Apply :func:`resolve_threads` for a CPU run; CUDA runs keep torch's default. Returns the count set."""
    if not device.startswith("cpu"):
        return None
    count = resolve_threads(setting)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
