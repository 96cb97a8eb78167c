"""Torch threads for the cores that are free now, and OpenMP threads that sleep when they wait.

Beside one busy process on 2 cores, the demo's steps took 60-80 s instead of 1.5-7 s: torch ran
two OpenMP threads, and by default an OpenMP thread that waits for its partner spins on its core
(libgomp's ``OMP_WAIT_POLICY=active`` behaviour for a while, then it yields), so every parallel
region waited for the thread that shared its core with the other process. Two remedies, measured
side by side in ``benchmarks/systems/busy_threads.py``:

* :func:`passive_wait`: ``OMP_WAIT_POLICY=PASSIVE`` (a waiting thread sleeps), which must be in
  the environment before torch starts OpenMP, i.e. before ``import torch``. The demo does this:
  two passive threads took a median 26 s a step where two spinning ones took 81 s (and once did
  not finish 3 steps in 600 s);
* :func:`free_cores`: count the cores of this process's affinity that were idle over a short
  sample of ``/proc/stat`` and run that many threads: one thread took 41-51 s a step on the same
  busy machine, so the demo only reports the count (how busy the machine was at start).

Linux only (``/proc/stat``); elsewhere :func:`free_cores` returns None and the caller keeps its
default.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
BUSY_SHARE = 0.5
"""A core busier than this share of the sample (user + system + irq + steal time) counts as taken."""


def cpu_times(text: str) -> dict[int, tuple[int, int]]:
    """``{cpu: (busy jiffies, total jiffies)}`` of a ``/proc/stat`` text (its ``cpuN`` lines).

    Busy is everything but ``idle`` and ``iowait`` (fields 4 and 5); ``guest`` time is already
    inside ``user``, so only the first eight fields are summed."""
    times: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        values = [int(v) for v in fields[:8]]
        total = sum(values)
        times[int(name[3:])] = (total - values[3] - (values[4] if len(values) > 4 else 0), total)
    return times


def busy_shares(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Share of the time between two :func:`cpu_times` readings each core spent busy (0 when no
    time passed on it)."""
    shares = {}
    for cpu, (busy, total) in after.items():
        if cpu in before:
            spent = total - before[cpu][1]
            shares[cpu] = (busy - before[cpu][0]) / spent if spent > 0 else 0.0
    return shares


def count_free(shares: dict[int, float], allowed: set[int], busy_share: float = BUSY_SHARE) -> int:
    """Cores of ``allowed`` busy at most ``busy_share``; at least 1 (the run needs a thread)."""
    return max(1, sum(1 for cpu, share in shares.items() if cpu in allowed and share <= busy_share))


def free_cores(sample_s: float = 0.5) -> int | None:
    """Cores of this process's affinity that were free over ``sample_s`` seconds, or None where
    ``/proc/stat`` or the affinity cannot be read."""
    try:
        allowed = set(os.sched_getaffinity(0))
        before = cpu_times(PROC_STAT.read_text())
        time.sleep(sample_s)
        after = cpu_times(PROC_STAT.read_text())
    except (AttributeError, OSError, ValueError):
        return None
    return count_free(busy_shares(before, after), allowed)


def passive_wait() -> bool:
    """Ask OpenMP threads to sleep, not spin, while they wait (unless the user set a policy).
    Returns whether it can still act: False once torch is imported (OpenMP read it already)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return "torch" not in sys.modules
