"""Per-step metrics: JSONL always, TensorBoard and wandb when asked, a readable console line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: write null so every tool can read the file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON object per step to ``RUN_DIR/metrics.jsonl`` (fsynced per line)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = False, wandb: bool = False, run_name: str = "") -> None:
        self.path = run_dir / METRICS_FILE
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError("log.tensorboard=true needs `pip install tracerl[tensorboard]`") from err
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise RuntimeError("log.wandb=true needs `pip install tracerl[wandb]`") from err
            self._wandb = wandb_module.init(project="tracerl", name=run_name or run_dir.name, dir=str(run_dir))

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps after ``step``: they belong to a step lost when a run was killed."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
        step = int(record["step"])
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a tracerl run folder?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def console_line(record: dict[str, Any]) -> str:
    """A one-line summary of a step for terminals and CI logs."""
    keys = ("reward_mean", "effective_ratio", "loss", "eval_accuracy", "rollouts", "generated_tokens", "step_seconds")
    parts = [f"step {record['step']}"]
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        parts.append(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    return "  ".join(parts)


def is_interactive() -> bool:
    return sys.stdout.isatty()
