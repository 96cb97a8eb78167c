"""Starting and resuming runs from the command line, with a progress display."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tracerl.train.checkpoint import latest_checkpoint
from tracerl.train.config import config_from_yaml, config_to_yaml, resolve_config
from tracerl.train.loop import Trainer
from tracerl.train.metrics import console_line, is_interactive


def start_training(preset: str, out: str | Path, *, config_file: str | None = None,
                   overrides: list[str] | None = None, steps: int | None = None,
                   smoke: bool = False) -> Callable[[], list[dict[str, Any]]]:
    """Validate everything first (bad configs fail here), then return the run to start."""
    config = resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)
    if steps is not None:
        config.steps = steps
    run_dir = Path(out)
    if latest_checkpoint(run_dir) is not None:
        raise ValueError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    return lambda: _run(Trainer(config, run_dir), config.steps)


def resume_training(run_dir: str | Path, steps: int | None = None) -> Callable[[], list[dict[str, Any]]]:
    """Continue a run from its newest checkpoint with the config it was started with."""
    run_dir = Path(run_dir)
    folder = latest_checkpoint(run_dir)
    if folder is None:
        raise ValueError(f"{run_dir} has no checkpoint to resume from")
    config = config_from_yaml((folder / "config.yaml").read_text())
    if steps is not None:
        config.steps = steps
    return lambda: _run(Trainer(config, run_dir, resume=True), config.steps)


def _run(trainer: Trainer, steps: int) -> list[dict[str, Any]]:
    if not is_interactive():
        trainer.echo = lambda record: print(console_line(record), flush=True)
        return trainer.run(steps)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns) as progress:
        task = progress.add_task("", total=steps, completed=trainer.step_index)

        def show(record: dict[str, Any]) -> None:
            progress.update(task, completed=record["step"], description=console_line(record))

        trainer.echo = show
        return trainer.run(steps)
