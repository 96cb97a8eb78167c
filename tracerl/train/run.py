"""Starting and resuming runs from the command line, with a progress display."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from tracerl.train.checkpoint import latest_checkpoint
from tracerl.train.config_checks import check_device
from tracerl.train.config import TrainConfig, config_from_yaml, resolve_config
from tracerl.train.dist_config import check_dist
from tracerl.train.loop import Trainer
from tracerl.train.metrics import console_line, is_interactive
from tracerl.train.runfolder import RunFolderError, refuse_if_state


def start_training(preset: str, out: str | Path, *, config_file: str | None = None,
                   overrides: list[str] | None = None, steps: int | None = None,
                   smoke: bool = False) -> Callable[[], list[dict[str, Any]]]:
    """Validate everything first (bad configs and a folder that holds a run fail here, before
    anything is written), take the run folder, then return the run to start."""
    config = resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)
    if steps is not None:
        config.steps = steps
    run_dir = Path(out)
    refuse_if_state(run_dir)
    trainer = Trainer(config, run_dir)  # locks the folder, writes config.yaml and initial/
    return lambda: _run(trainer, config.steps)


def resume_training(run_dir: str | Path, steps: int | None = None, device: str | None = None,
                    nproc: int | None = None) -> Callable[[], list[dict[str, Any]]]:
    """Continue a run from its newest checkpoint with the config it was started with.

    A run killed before its first checkpoint has only ``config.yaml`` (and partial state): it
    restarts from step 0 with that config, which is what a fresh start would do. A fresh start
    on such a folder is refused, so nothing is reused or overwritten without ``--resume``.
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    if nproc is not None:  # a run saved by N processes resumes at any count (its shards are in DCP)
        config.dist.nproc = nproc
        check_dist(config)
    if steps is not None:
        config.steps = steps
    if device is not None:  # e.g. a run started on cuda:1 continues on a machine with one GPU
        config.model.device = device
    check_device(config.model.device)
    trainer = Trainer(config, run_dir, resume=True)
    return lambda: _run(trainer, config.steps)


def read_run_config(run_dir: Path) -> TrainConfig:
    """The config a run continues with: its newest checkpoint's, else the folder's ``config.yaml``."""
    folder = latest_checkpoint(run_dir)
    source = (folder if folder is not None else run_dir) / "config.yaml"
    if not source.is_file():
        raise RunFolderError(f"{run_dir} has no checkpoint and no config.yaml: not a tracerl run folder")
    try:
        return config_from_yaml(source.read_text())
    except yaml.YAMLError as err:
        raise RunFolderError(f"{source} is not valid YAML ({type(err).__name__}); restore it") from None


def _run(trainer: Trainer, steps: int) -> list[dict[str, Any]]:
    with trainer:  # releases the run folder's lock however the run ends
        return _run_with_progress(trainer, steps)


def _run_with_progress(trainer: Trainer, steps: int) -> list[dict[str, Any]]:
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
