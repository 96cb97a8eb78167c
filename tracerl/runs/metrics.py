"""Per-step metrics: JSONL always, TensorBoard and wandb when asked, a readable console line."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from tracerl.envs.bounded import MiB, line_too_long, lines_limited, loads_json, open_regular
from tracerl.runs.folder import fsync_dir, write_atomic
from tracerl.errors import UserError

METRICS_FILE = "metrics.jsonl"
MAX_METRICS_LINE = 1 * MiB
"""Longest step record read back (a record is ~1 KB): a longer line is damage, not a step."""
MAX_METRIC_KEYS = 4096
"""Most distinct keys a metrics file may hold across its lines (a run writes a few hundred)."""


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: write null so every tool can read the file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def is_timing_key(key: str) -> bool:
    """Whether a record key measures the machine (wall time, throughput, memory), not training:
    such keys differ between two runs that are otherwise identical (e.g. a resumed run)."""
    return key.startswith(("time_", "peak_mem_")) or key in ("step_seconds", "generated_tokens_per_s")


def tag(key: str) -> str:
    """TensorBoard/W&B tag of a record key, grouped: ``eval/``, ``time/`` (phase times, memory) or ``train/``."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    if is_timing_key(key):
        return "time/" + key.removeprefix("time_")
    return "train/" + key


def flat_hparams(config: Any) -> dict[str, Any]:
    """``a.b.c -> value`` of a config dataclass; lists and None as text (what hparams accept)."""
    from dataclasses import asdict, is_dataclass

    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", asdict(config) if is_dataclass(config) else dict(config))
    return out


class MetricsLog:
    """Appends one JSON object per step to ``RUN_DIR/metrics.jsonl`` (fsynced per line); also
    TensorBoard (tags grouped by :func:`tag`, the config as hparams) and W&B when asked.

    ``config``: the run's :class:`~tracerl.config.schema.TrainConfig` (W&B project/entity from
    ``log.wandb_project`` / ``log.wandb_entity``; hparams). The extras' presence is checked at
    config load (``check_extra``), so the import errors below only fire for direct library use.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool = False, wandb: bool = False, run_name: str = "",
                 config: Any = None) -> None:
        self.path = run_dir / METRICS_FILE
        self._tb = None
        self._wandb = None
        self._hparams = flat_hparams(config) if config is not None else {}
        self._last_eval: dict[str, float] = {}
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError("log.tensorboard=true needs `pip install -e '.[tensorboard]'`") from err
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise RuntimeError("log.wandb=true needs `pip install -e '.[wandb]'`") from err
            log_cfg = getattr(config, "log", None)
            try:
                self._wandb = wandb_module.init(project=getattr(log_cfg, "wandb_project", "tracerl"),
                                                entity=getattr(log_cfg, "wandb_entity", "") or None,
                                                name=run_name or run_dir.name, dir=str(run_dir),
                                                config=self._hparams or None)
            except Exception as err:  # noqa: BLE001 - wandb's login and network errors are the user's to fix
                first = " ".join(str(err).split())[:200]
                raise UserError(f"log.wandb = true: W&B could not start ({type(err).__name__}: {first}); run "
                                "`wandb login`, or set WANDB_MODE=offline to log locally, or log.wandb=false") from None

    def truncate_after(self, step: int) -> None:
        """Keep only the lines of steps ``<= step`` (those the checkpoint reflects), atomically.

        Lines of later steps belong to steps a kill lost (the line is written before the
        checkpoint); those steps run again and write their lines anew, so every step appears
        once. A torn last line is dropped with a warning. The file is rewritten under a
        temporary name and swapped in with ``os.replace``, so a kill here loses nothing.
        """
        if not self.path.exists():
            return
        kept = [record for record in parse_metrics(self.path, warn=True) if int(record["step"]) <= step]
        write_atomic(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept).encode())

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line and fsync it: when this returns, the line survives a crash."""
        record = {k: _clean(v) for k, v in record.items()}
        created = not self.path.exists()
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if created:
            fsync_dir(self.path.parent)
        step = int(record["step"])
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}
        numeric.pop("step", None)
        self._last_eval.update({tag(k): float(v) for k, v in numeric.items() if k.startswith("eval_")})
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(tag(key), value, step)
        if self._wandb is not None:
            self._wandb.log({tag(k): v for k, v in numeric.items()}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            if self._hparams:  # the run's config beside its last held-out numbers (HPARAMS tab)
                metrics = {f"hparam/{k}": v for k, v in self._last_eval.items()}
                self._tb.add_hparams(self._hparams, metrics or {"hparam/none": 0.0}, run_name=".")
            self._tb.close()
            self._tb = None  # idempotent: a Trainer may be closed twice
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def parse_metrics(path: Path, *, warn: bool = False) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (no newline or bad JSON) is dropped.

    A kill mid-append can leave only the last line torn; a bad line anywhere else means the
    file was damaged by something else and is a ``ValueError`` naming file and line.
    """
    if Path(path).is_symlink():
        raise ValueError(f"{path} is a symbolic link; a run's metrics file must be its own file: remove the link")
    lines: list[tuple[int, bytes]] = []
    tail: tuple[int, bytes] | None = None  # bytes after the last newline (an append cut short)
    with open_regular(path) as handle:
        for number, raw in lines_limited(handle, MAX_METRICS_LINE):
            if raw is None:
                raise ValueError(line_too_long(f"{path}:{number}", MAX_METRICS_LINE) + "; the file is damaged")
            if not raw.endswith(b"\n"):
                tail = (number, raw)
            elif raw.strip():
                lines.append((number, raw))
    records: list[dict[str, Any]] = []
    keys: set[str] = set()
    for index, (number, raw) in enumerate(lines):
        record = _parse_line(raw)
        if record is None:
            if index < len(lines) - 1:
                raise ValueError(f"{path}:{number}: not a JSON step record; the file is damaged")
            _warn_torn(path, number, warn)
            continue
        step = record["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"{path}:{number}: field 'step' must be a non-negative integer, got "
                             f"{type(step).__name__ if not isinstance(step, (int, float)) else _short(step)}; "
                             "the file is damaged")
        keys.update(record)
        if len(keys) > MAX_METRIC_KEYS:  # memory: a crafted file of many distinct keys, each line under the cap
            raise ValueError(f"{path}:{number}: more than {MAX_METRIC_KEYS} distinct metric keys in the file "
                             "(a tracerl run writes a few hundred); the file is not one tracerl wrote")
        records.append(record)
    if tail is not None and tail[1].strip():  # an append cut before its newline, even if the JSON parses
        _warn_torn(path, tail[0], warn)
    return records


def _short(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else ("a huge integer" if abs(value) > 10**18 else str(value))


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    try:
        record = loads_json(raw.decode("utf-8"))
    except ValueError:
        return None
    return record if isinstance(record, dict) and "step" in record else None


def _warn_torn(path: Path, number: int, warn: bool) -> None:
    if warn:
        warnings.warn(f"{path}:{number}: dropped a torn last line (a run was killed while writing it)",
                      stacklevel=3)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete step record of a run folder (a torn last line is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a tracerl run folder?")
    return parse_metrics(path)


def console_line(record: dict[str, Any]) -> str:
    """A one-line summary of a step for terminals and CI logs."""
    keys = ("reward_mean", "effective_ratio", "loss", "eval_accuracy", "rollouts", "generated_tokens", "generated_tokens_per_s",
            "step_seconds")
    parts = [f"step {record['step']}"]
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        parts.append(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    for key in ("infra_failed", "nonfinite_skipped_total"):  # faults: shown only when there are some
        if record.get(key):
            parts.append(f"{key}={record[key]}")
    return "  ".join(parts)


def is_interactive() -> bool:
    return sys.stdout.isatty()
