"""What ``tracerl train`` (and ``trainer().run()``) prints: a header, one progress line per step, a footer.

The progress line fits the terminal (``$COLUMNS``, else the terminal's width, else 100): step
N/M, elapsed, ETA and the key metrics, which are dropped from the end, never cut mid-value,
when the line would not fit. The header and footer break between their ``|``-separated parts
to fit the same width. The full record is in ``metrics.jsonl``; the console is a glance.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

from tracerl.progress import clock, eta_seconds

KEY_METRICS: tuple[tuple[str, str], ...] = (
    ("eval_accuracy", "eval"),
    ("reward_mean", "reward"),
    ("effective_ratio", "mixed"),
    ("loss", "loss"),
)
"""(record key, short label) shown after the clock, most important first."""
FAULT_KEYS = ("infra_failed", "nonfinite_skipped_total")
"""Shown only when non-zero, before the metrics: a failing tool or a skipped update matters more."""
MIN_WIDTH = 40


def terminal_width(default: int = 100) -> int:
    """Columns of the terminal (``$COLUMNS`` first); ``default`` when not a terminal."""
    return max(MIN_WIDTH, shutil.get_terminal_size((default, 24)).columns)


def _value(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def progress_line(record: dict[str, Any], total: int, elapsed: float, done: int, width: int,
                  time_left: float | None = None) -> str:
    """One step's line, at most ``width`` characters.

    ``total``: the run's target step; ``elapsed``: seconds since this process started training;
    ``done``: steps this process ran (the ETA's pace, so a resumed run is not credited with
    steps it did not run); ``time_left``: seconds to a wall-clock deadline that ends the run
    first when the steps would take longer (the demo's budget), or None.
    """
    step = int(record["step"])
    eta = eta_seconds(elapsed, done, total - step)
    if time_left is not None:
        eta = max(time_left, 0.0) if eta is None else min(eta, max(time_left, 0.0))
    head = f"step {step}/{total}  {clock(elapsed)} ETA {clock(eta)}"
    parts = [f"{k}={record[k]}" for k in FAULT_KEYS if record.get(k)]
    parts += [f"{label} {_value(record[k])}" for k, label in KEY_METRICS if record.get(k) is not None]
    line = head
    for part in parts:
        if len(line) + 2 + len(part) > width:
            break
        line += "  " + part
    return line[:width]


def fit(parts: list[str], width: int) -> str:
    """``parts`` joined by `` | `` on as few lines as fit ``width``, broken only between parts
    (a part wider than ``width`` alone is broken between words, never inside one)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " | " + part
        else:
            lines += textwrap.wrap(part, width, break_long_words=False, break_on_hyphens=False) or [part]
    return "\n".join(lines)


def header(config: Any, run_dir: Path, parameters: int, start_step: int, *, width: int = 100,
           format_why: str = "") -> str:
    """``train trace | model tiny (default), 0.99M parameters | format react (...) | run runs/x |
    device cpu | steps 0 -> 200``, on as many lines of ``width`` as it needs (:func:`fit`).

    ``format_why``: why the run uses its ``model.format`` (config/model_format.py); ``dist.nproc > 1``
    adds the process count to the device."""
    model = config.model.name_or_path
    if model == "tiny":
        model = f"tiny ({config.model.tiny_preset})"
    fmt = f"format {config.model.format}" + (f" ({format_why})" if format_why else "")
    device = f"device {config.model.device}"
    nproc = getattr(getattr(config, "dist", None), "nproc", 1)
    if nproc > 1:
        device += f", {nproc} processes (FSDP2)"
    parts = [f"train {config.preset}", f"model {model}, {parameters / 1e6:.2f}M parameters", fmt, f"run {run_dir}",
             device, f"steps {start_step} -> {config.steps}"]
    return fit(parts, width)


def footer(records: list[dict[str, Any]], checkpoint: Path | None, *, width: int = 100,
           plot: Path | None = None) -> str:
    """The last evaluation of this process's records, the checkpoint to resume or evaluate and the
    run's plot, on as many lines of ``width`` as it needs (:func:`fit`)."""
    evals = [r for r in records if r.get("eval_accuracy") is not None]
    if evals:
        last = evals[-1]
        more = "".join(f", {label} {_value(last[k])}" for k, label in (("eval_f1", "F1"), ("eval_turns", "turns"))
                       if last.get(k) is not None)
        evaluation = f"final evaluation at step {last['step']}: accuracy {_value(last['eval_accuracy'])}{more}"
    else:
        evaluation = "no evaluation ran"
    where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint written"
    return fit([evaluation, where] + ([f"plot {plot}"] if plot is not None else []), width)
