"""``tracerl view RUN_DIR``: static HTML pages of a run's rollout trees, one per step, plus an index.

Reads ``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz`` (train/rollout_log.py) and ``metrics.jsonl``;
writes ``OUT/step-NNNNNN.html`` and ``OUT/index.html`` (default ``OUT = RUN_DIR/view``). Each page
is self-contained, so the folder can be copied anywhere and opened from disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.train.metrics import METRICS_FILE, parse_metrics
from tracerl.train.rollout_log import ROLLOUTS_DIR, logged_steps, read_step
from tracerl.train.runfolder import write_atomic
from tracerl.train.view_html import index_page, step_page

VIEW_DIR = "view"


class ViewError(ValueError):
    """The run folder has nothing to show (no rollout records, or not the step asked for)."""


def render_run(run_dir: str | Path, out: str | Path | None = None, step: int | None = None) -> Path:
    """Write the step pages (all logged steps, or only ``step``) and the index; returns the index path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ViewError(f"{run_dir} is not a folder; give a run folder written by `tracerl train`")
    steps = logged_steps(run_dir)
    if not steps:
        raise ViewError(f"{run_dir / ROLLOUTS_DIR} holds no step records: train with log.rollouts=true "
                        "(the default) to record them")
    if step is not None and step not in steps:
        raise ViewError(f"step {step} has no rollout record in {run_dir / ROLLOUTS_DIR}; "
                        f"logged steps: {_describe(steps)}")
    out_dir = Path(out) if out is not None else run_dir / VIEW_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    records = _metrics(run_dir)
    by_step = {int(r["step"]): r for r in records}
    for s in [step] if step is not None else steps:
        at = steps.index(s)
        neighbours = (steps[at - 1] if at > 0 else None, steps[at + 1] if at + 1 < len(steps) else None)
        html = step_page(run_dir.name, s, read_step(run_dir, s), by_step.get(s), neighbours)
        write_atomic(out_dir / f"step-{s:06d}.html", html.encode("utf-8"))
    pages = {s: f"step-{s:06d}.html" for s in steps if (out_dir / f"step-{s:06d}.html").exists()}
    index = out_dir / "index.html"
    write_atomic(index, index_page(run_dir.name, records, pages).encode("utf-8"))
    return index


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    return parse_metrics(path) if path.exists() else []


def _describe(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
