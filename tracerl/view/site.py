"""``tracerl view RUN_DIR``: static HTML pages of a run's rollout trees, one per step, plus an index.

Reads ``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz`` (runs/rollout_log.py) and ``metrics.jsonl``;
writes ``OUT/step-NNNNNN.html`` and ``OUT/index.html`` (default ``OUT = RUN_DIR/view``). Each page
is self-contained, so the folder can be copied anywhere and opened from disk.

A run folder may come from someone else. What the view then guarantees: records are read
within caps (rollout_log's ``MAX_LINE_BYTES``/``MAX_FILE_BYTES``, :data:`MAX_METRICS_BYTES`) and
validated before they reach HTML (view/records.py), so crafted records end in one line
naming ``file:line`` and the field, never in script on the page; a ``rollouts/``, ``view/`` or
``metrics.jsonl`` that is a symbolic link is refused, so pages meant for the run folder never
land outside it; pages are written atomically, and temporaries left by a killed view are
removed by the next one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from tracerl.errors import UserError
from tracerl.runs.metrics import METRICS_FILE, parse_metrics
from tracerl.runs.rollout_log import ROLLOUTS_DIR, logged_steps, refuse_link, step_file
from tracerl.runs.folder import remove_stale_temps, write_atomic
from tracerl.view.html import index_page, step_page
from tracerl.view.records import load_step

VIEW_DIR = "view"
MAX_METRICS_BYTES = 256 * 2**20
"""Largest ``metrics.jsonl`` the view reads (a run of 100k steps writes well under this)."""


class ViewError(UserError):
    """The run folder has nothing to show (no rollout records, or not the step asked for)."""


def render_run(run_dir: str | Path, out: str | Path | None = None, step: int | None = None) -> Path:
    """Write the step pages (all logged steps, or only ``step``) and the index; returns the index path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ViewError(f"{run_dir} is not a folder; give a run folder written by `tracerl train`")
    refuse_link(run_dir / ROLLOUTS_DIR, "tracerl view reads rollout records")
    steps = logged_steps(run_dir)
    if not steps:
        raise ViewError(f"{run_dir / ROLLOUTS_DIR} holds no step records: train with log.rollouts=true "
                        "(the default) to record them")
    if step is not None and step not in steps:
        raise ViewError(f"step {step} has no rollout record in {run_dir / ROLLOUTS_DIR}; "
                        f"logged steps: {_describe(steps)}")
    out_dir = output_folder(run_dir, out)
    records = read_view_metrics(run_dir)
    by_step = {int(r["step"]): r for r in records}
    for s in [step] if step is not None else steps:
        at = steps.index(s)
        neighbours = (steps[at - 1] if at > 0 else None, steps[at + 1] if at + 1 < len(steps) else None)
        html = step_page(run_dir.name, s, load_step(step_file(run_dir, s)), by_step.get(s), neighbours)
        write_page(out_dir / f"step-{s:06d}.html", html)
    pages = {s: f"step-{s:06d}.html" for s in steps if (out_dir / f"step-{s:06d}.html").is_file()}
    index = out_dir / "index.html"
    write_page(index, index_page(run_dir.name, records, pages))
    return index


def output_folder(run_dir: Path, out: str | Path | None) -> Path:
    """The folder pages go to, created, with temporaries of killed views removed.

    An output inside the run folder (the default ``RUN_DIR/view``, or an ``--out`` that names a
    path under it) must be reached without symbolic links: a link there, even a dangling one,
    would send the pages outside the run folder, so it is refused. An ``--out`` elsewhere is
    used as given."""
    out_dir = Path(out) if out is not None else run_dir / VIEW_DIR
    for link in _links_below(run_dir, out_dir):
        refuse_link(link, "tracerl view writes its pages")
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir, holding_lock=False)  # tracerl's own, and only those whose writer died
    return out_dir


def _links_below(run_dir: Path, out_dir: Path) -> list[Path]:
    """The paths from just below ``run_dir`` down to ``out_dir`` (lexically, ``..`` resolved) that are
    symbolic links; empty when ``out_dir`` is not inside ``run_dir``."""
    root, target = Path(os.path.abspath(run_dir)), Path(os.path.abspath(out_dir))
    if root == target or root not in target.parents:
        return []
    path, links = root, []
    for part in target.relative_to(root).parts:
        path = path / part
        if path.is_symlink():
            links.append(path)
    return links


def write_page(path: Path, html: str) -> None:
    """Write one page atomically (its temporary is created exclusively: never through a planted link)."""
    try:
        write_atomic(path, html.encode("utf-8"))
    except OSError as err:  # a full disk fails in write(), which names no file: name the page
        if err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
        raise


def read_view_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics lines (none when there is no ``metrics.jsonl``), bounded and checked: a plain
    file of at most :data:`MAX_METRICS_BYTES`, each line's ``step`` a non-negative integer."""
    path = run_dir / METRICS_FILE
    refuse_link(path, "tracerl view reads metrics")
    if not path.exists():
        return []
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ViewError(f"{path} is not a regular file; restore the run's metrics.jsonl or delete it")
    if info.st_size > MAX_METRICS_BYTES:
        raise ViewError(f"{path} holds {info.st_size} bytes, more than the {MAX_METRICS_BYTES} "
                        "tracerl view reads (view.MAX_METRICS_BYTES)")
    try:  # each line's step a non-negative integer, at most MAX_METRIC_KEYS distinct keys (runs/metrics.py)
        return parse_metrics(path)
    except RecursionError:
        raise ViewError(f"{path}: a line is JSON nested too deeply to be a step record") from None
    except ValueError as err:
        raise ViewError(str(err)) from None


def _describe(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
