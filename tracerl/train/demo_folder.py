"""Where a demo writes: a new run folder in ``--out`` each time, never over a previous run.

The first demo in ``demo_out`` writes ``run/``, ``summary.json`` and ``curves.png``; the next
ones ``run-2/``, ``summary-2.json``, ``curves-2.png`` and so on, so a second ``tracerl demo``
leaves the first run's checkpoint, metrics and ``view/`` as they were. A folder is a demo
folder when it holds the :data:`MARK` file (written by the first demo) or the layout demos
wrote before the mark existed; an ``--out`` that holds anything else is refused, so the
demo's files never mix with the user's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracerl.errors import UserError

MARK = ".tracerl-demo"
"""Written into ``--out`` by the first demo: the folder is the demo's, later demos add runs to it."""
LEGACY = ("run", "unseen_world")
"""What a demo folder held before :data:`MARK` existed (both entries)."""
_RUN = re.compile(r"run(?:-([0-9]+))?")


class DemoFolderError(UserError):
    """``--out`` holds files that are not a demo's."""


@dataclass(frozen=True)
class DemoPaths:
    """One demo's outputs inside ``--out``."""

    out: Path
    run: Path
    summary: Path
    curves: Path
    number: int


def paths_for(out: Path, number: int) -> DemoPaths:
    """Run ``number`` (1: ``run``, ``summary.json``, ``curves.png``; n: ``run-n``, ``summary-n.json``, ...)."""
    suffix = "" if number == 1 else f"-{number}"
    return DemoPaths(out, out / f"run{suffix}", out / f"summary{suffix}.json", out / f"curves{suffix}.png", number)


def is_demo_folder(out: Path) -> bool:
    return (out / MARK).is_file() or all((out / name).is_dir() for name in LEGACY)


def claim(out: Path) -> DemoPaths:
    """Create the next free run folder of ``out`` and return its paths.

    ``out`` may be missing or empty (it becomes a demo folder) or a demo folder; anything else is a
    :class:`DemoFolderError` naming it. The run folder is made with ``mkdir`` (not ``exist_ok``),
    so two demos started at once into the same ``out`` get different numbers."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DemoFolderError(f"--out {out} is a file; give a folder (new, empty, or an earlier demo's)")
    if out.is_dir() and any(out.iterdir()) and not is_demo_folder(out):
        shown = ", ".join(sorted(p.name for p in out.iterdir())[:5])
        raise DemoFolderError(f"--out {out} is not empty ({shown}, ...) and is not a tracerl demo folder (no {MARK}); "
                              "the demo does not mix its files with others: give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).touch()
    used = [int(m.group(1) or 1) for p in out.iterdir() if (m := _RUN.fullmatch(p.name))]
    number = max(used, default=0) + 1
    while True:
        paths = paths_for(out, number)
        try:
            paths.run.mkdir()
        except FileExistsError:  # another demo took this number a moment ago
            number += 1
            continue
        if paths.summary.exists() or paths.curves.exists():  # left by hand without its run folder: keep them
            paths.run.rmdir()
            number += 1
            continue
        return paths
