"""``--overwrite`` (and ``trainer(..., overwrite=True)``): remove a previous run from its folder, and
nothing else.

Only a tracerl run folder is cleared: one that holds run state (``metrics.jsonl``, ``initial/``,
``LATEST``, ``ckpt-*``) or the lock file every run takes. Of such a folder only the entries tracerl
writes go (:func:`~tracerl.runs.folder.run_entries` and ``plot.png``); a file of the user's beside
them stays, and a folder that is not a run (a home directory given as ``--out`` by mistake) loses
nothing. The folder is checked first (no link inside may lead a delete outside it) and locked
while cleared, so a run in progress is never removed. What goes is said in one line first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tracerl.runs.folder import LOCK_FILE, RunFolderError, RunLock, check_run_folder, run_entries, run_state

PLOT_FILE = "plot.png"
"""The run's plot (train/run.py ``write_plot``): written into the run folder, so it is the run's."""


def is_run_folder(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a folder a tracerl run has used: run state, or the lock every run takes."""
    run_dir = Path(run_dir)
    return run_dir.is_dir() and (bool(run_state(run_dir)) or os.path.lexists(run_dir / LOCK_FILE))


def removable_entries(run_dir: Path) -> list[Path]:
    """What :func:`overwrite_run_folder` would remove (sorted; empty when ``run_dir`` is not a run folder).
    The lock file stays: the next run takes it again (deleting it could let two runs lock two files)."""
    run_dir = Path(run_dir)
    if not is_run_folder(run_dir):
        return []
    entries = [p for p in run_entries(run_dir) if p.name != LOCK_FILE]
    plot = run_dir / PLOT_FILE
    if os.path.lexists(plot):
        entries.append(plot)
    return sorted(entries)


def overwrite_run_folder(run_dir: str | Path, notify: Callable[[str], None] | None = None) -> list[str]:
    """Remove the previous run in ``run_dir`` (tracerl's entries only) and return the names removed.

    ``notify`` gets one line naming everything removed before it goes (nothing when there is none).
    Raises :class:`~tracerl.runs.folder.RunFolderError` when ``run_dir`` is a file, holds a link or
    a special file among the run's entries, or is in use by another process.
    """
    run_dir = Path(run_dir)
    if os.path.lexists(run_dir) and not run_dir.is_dir():
        raise RunFolderError(f"--overwrite: {run_dir} is not a folder; choose another --out")
    check_run_folder(run_dir)  # a link inside could lead a delete outside the folder
    entries = removable_entries(run_dir)
    if not entries:
        return []
    lock = RunLock(run_dir)  # fails in one line naming the process that holds the folder
    try:
        names = [f"{p.name}/" if p.is_dir() and not p.is_symlink() else p.name for p in entries]
        if notify is not None:
            notify(f"overwrite: removing the previous run in {run_dir}: {', '.join(names)} (other files there stay)")
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
    finally:
        lock.release()
    return names
