"""Rolling a diverged run back to its last good checkpoint (``optim.divergence.mode=rollback``).

The divergence guard names the step whose rollouts first showed the divergence (the onset).
Those rollouts were sampled from the weights after update ``onset - 1``, so a checkpoint is
good when its step is at most ``onset - 2``. Nothing is deleted: the records and checkpoints
of the later steps move into ``diverged-step-NNNNNN/`` (the step the guard fired at) beside
them, and ``LATEST`` is pointed back at the good checkpoint, which the trainer then restores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tracerl.runs.checkpoint import LATEST
from tracerl.runs.folder import CHECKPOINT_FOLDER, write_atomic
from tracerl.runs.metrics import METRICS_FILE, parse_metrics
from tracerl.runs.rollout_log import logged_steps, step_file


def good_checkpoint(run_dir: Path, onset: int) -> Path | None:
    """The newest ``ckpt-NNNNNN`` of ``run_dir`` whose step is at most ``onset - 2``, else None."""
    steps = sorted(int(p.name[len("ckpt-"):]) for p in Path(run_dir).iterdir()
                   if CHECKPOINT_FOLDER.fullmatch(p.name) and p.is_dir())
    good = [s for s in steps if s <= onset - 2]
    return Path(run_dir) / f"ckpt-{good[-1]:06d}" if good else None


def set_aside(run_dir: Path, good: Path, fired_at: int) -> Path:
    """Move what the run wrote after checkpoint ``good`` into ``run_dir/diverged-step-<fired_at>/``
    (metrics lines, rollout records, later checkpoints) and point ``LATEST`` at ``good``.

    Ordered so a kill at any point leaves a run that resumes from ``good``: the moved metrics
    lines are copied before ``LATEST`` moves (a resume truncates the originals), the checkpoints
    after it. Returns the folder the records went to."""
    run_dir, step = Path(run_dir), int(good.name[len("ckpt-"):])
    aside = run_dir / f"diverged-step-{fired_at:06d}"
    (aside / "rollouts").mkdir(parents=True, exist_ok=True)
    metrics = run_dir / METRICS_FILE
    later = [r for r in parse_metrics(metrics) if int(r["step"]) > step] if metrics.exists() else []
    write_atomic(aside / METRICS_FILE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in later).encode())
    for logged in logged_steps(run_dir):
        if logged > step:
            source = step_file(run_dir, logged)
            os.replace(source, aside / "rollouts" / source.name)
    write_atomic(run_dir / LATEST, good.name.encode())
    for folder in sorted(run_dir.iterdir()):
        if CHECKPOINT_FOLDER.fullmatch(folder.name) and int(folder.name[len("ckpt-"):]) > step:
            os.replace(folder, aside / folder.name)
    return aside
