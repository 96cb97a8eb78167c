"""Starting and resuming runs from the command line, with a progress display (``trainer().run()`` shows it too)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from tracerl.config.no_import import import_paths
from tracerl.envs.health import ToolHealthError
from tracerl.envs.verifiers import VerifierError
from tracerl.errors import UserError
from tracerl.runs.checkpoint import latest_checkpoint
from tracerl.config.checks import check_device, check_wandb
from tracerl.config.loading import ConfigError, from_dict, load_yaml, merge, parse_override, to_dict
from tracerl.config.preset_help import unknown_preset
from tracerl.config.presets import PRESETS
from tracerl.config.resume_rule import check_resume_changes
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.config.dist import check_dist
from tracerl.config.model_format import format_reason
from tracerl.train.loop import Trainer
from tracerl.runs.console import footer, header, progress_line, terminal_width
from tracerl.runs.run_config import TRUST_FLAG, read_run_config
from tracerl.runs.folder import RunFolderError, check_run_folder, refuse_if_state


def refuse_config_in_run(config_file: str | Path | None, run_dir: Path) -> None:
    """Refuse ``--config RUN_DIR/config.yaml``: the run writes its resolved config there, so the
    user's own file would be overwritten at start (and removed if set-up then failed)."""
    if not config_file:
        return
    target = run_dir / "config.yaml"
    same = Path(config_file).resolve() == target.resolve()
    if not same and target.exists():
        same = Path(config_file).exists() and Path(config_file).samefile(target)
    if same:
        raise RunFolderError(f"--config {config_file} is the file the run writes its resolved config to "
                             f"({target}); keep your config outside --out {run_dir} (e.g. {run_dir}.yaml)")


def start_training(preset: str, out: str | Path, *, config_file: str | None = None,
                   overrides: list[str] | None = None, steps: int | None = None,
                   smoke: bool | str = False,
                   start_driver: Callable[[Trainer], Any] | None = None) -> Callable[[], list[dict[str, Any]]]:
    """Validate everything first (bad configs and a folder that holds a run fail here, before
    anything is written), take the run folder, then return the run to start. ``start_driver``:
    see :class:`~tracerl.train.loop.Trainer` (``dist.nproc > 1`` under torchrun)."""
    run_dir = Path(out)
    refuse_config_in_run(config_file, run_dir)
    check_run_folder(run_dir)
    config = resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)
    if steps is not None:
        config.steps = steps
    refuse_if_state(run_dir)
    trainer = Trainer(config, run_dir, start_driver=start_driver)  # locks the folder, writes config.yaml and initial/
    return lambda: _run(trainer, config.steps)


def resume_training(run_dir: str | Path, steps: int | None = None, device: str | None = None,
                    notify: Callable[[str], None] | None = None,
                    nproc: int | None = None, trust_code: bool = False,
                    start_driver: Callable[[Trainer], Any] | None = None, *, preset: str | None = None,
                    config_file: str | None = None,
                    overrides: Sequence[str] = ()) -> Callable[[], list[dict[str, Any]]]:
    """Continue a run from its newest checkpoint with the config it was started with.

    ``preset``, ``config_file`` and ``overrides`` (``--set``) may change only what a resume may
    change (:mod:`tracerl.config.resume_rule`); anything else is refused in one line naming each
    key with the run's value and the given one. A run killed before its first checkpoint has only
    ``config.yaml`` (and partial state): it restarts from step 0 with that config, which is what a
    fresh start would do. A fresh start on such a folder is refused, so nothing is reused or
    overwritten without ``--resume``. A target at or below the checkpoint's step is refused in one
    line; ``notify`` (default: stderr) is told which checkpoint was loaded and what changed.
    """
    notify = notify or _stderr
    run_dir = Path(run_dir)
    check_run_folder(run_dir)
    folder = latest_checkpoint(run_dir)
    config, changed = resumed_config(run_dir, preset=preset, config_file=config_file, overrides=overrides,
                                     trust_code=trust_code)  # imports no plug-in the user did not trust
    if nproc is not None:  # a run saved by N processes resumes at any count (its shards are in DCP)
        config.dist.nproc = nproc
        check_dist(config)
    if steps is not None:
        config.steps = steps
    done = checkpoint_step(folder) if folder is not None else 0
    if config.steps <= done:  # nothing to train: say so instead of exiting 0 in silence
        asked = f"--steps {steps}" if steps is not None else f"its config's steps = {config.steps}"
        raise UserError(f"{run_dir} is already at step {done} ({folder}) and {asked} asks for no more; "
                        f"give --steps above {done} to continue it")
    if device is not None:  # e.g. a run started on cuda:1 continues on a machine with one GPU
        config.model.device = device
    check_device(config.model.device)
    check_wandb(config)  # before the run folder is touched
    trainer = Trainer(config, run_dir, resume=True, start_driver=start_driver)
    loaded = f"from {folder} (step {done})" if folder is not None else "with no checkpoint yet: from step 0"
    applied = f", with {', '.join(changed)} changed" if changed else ""
    notify(f"resuming {run_dir} {loaded} to step {config.steps}{applied}")
    return lambda: _run(trainer, config.steps)


def resumed_config(run_dir: Path, *, preset: str | None = None, config_file: str | None = None,
                   overrides: Sequence[str] = (), trust_code: bool = False) -> tuple[TrainConfig, list[str]]:
    """The config a resume continues with and the keys the call changes: the run's own
    (:func:`run_folder_config`) with ``preset``, the ``config_file`` YAML and ``overrides`` laid over
    it, checked field by field as a fresh start is, then refused outside
    :data:`~tracerl.config.resume_rule.RESUME_MUTABLE` (one line naming each key and both values)."""
    saved = run_folder_config(run_dir, trust_code=trust_code)
    if not preset and not config_file and not overrides:
        return saved, []
    data = to_dict(saved)
    if preset:
        data = merge(data, {"preset": preset})
    if config_file:
        data = merge(data, load_yaml(config_file))
    for text in overrides:
        data = merge(data, parse_override(text))
    if preset and preset not in PRESETS:
        raise ConfigError(unknown_preset(preset))
    given = from_dict(TrainConfig, data)  # a bad value is named as on a fresh start
    changed = check_resume_changes(to_dict(saved), to_dict(given), run_dir, "--out NEW_RUN_DIR")
    return given, changed


def run_folder_config(run_dir: Path, *, trust_code: bool = False) -> TrainConfig:
    """The config a run continues with: its newest checkpoint's, else the folder's ``config.yaml``
    (read bounded; plug-in import paths need ``trust_code``, see :mod:`tracerl.runs.run_config`)."""
    folder = latest_checkpoint(run_dir)
    source = (folder if folder is not None else run_dir) / "config.yaml"
    if not source.is_file():
        raise RunFolderError(f"{run_dir} has no checkpoint and no config.yaml: not a tracerl run folder")
    if folder is not None:
        from tracerl.runs.model_identity import check_same_model

        check_same_model(run_dir, folder)  # an edited preset, model or tiny_preset: one line
    return read_run_config(source, trust_code=trust_code)


def checkpoint_step(folder: Path) -> int:
    """The step a ``ckpt-NNNNNN`` folder holds (its name, checked by ``latest_checkpoint``)."""
    return int(folder.name.removeprefix("ckpt-"))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(trainer: Trainer, steps: int) -> list[dict[str, Any]]:
    """Train to ``steps`` between a header and a footer, one progress line per step (runs/console.py).
    Ctrl-C prints one line on stderr (:func:`interrupted_line`) and propagates (exit 130)."""
    with trainer:  # releases the run folder's lock however the run ends
        try:
            return console_run(trainer, steps, lambda: trainer.run(steps))
        except KeyboardInterrupt:
            _stderr(interrupted_line(trainer, steps))
            raise


def interrupted_line(trainer: Trainer, steps: int) -> str:
    """What Ctrl-C leaves: the step reached, the checkpoint a resume continues from, the exact command."""
    command = f"tracerl train --resume {shlex.quote(str(trainer.run_dir))}"
    if import_paths(to_dict(trainer.config)):
        command += f" {TRUST_FLAG}"  # its plug-ins were trusted to start it; a resume asks again
    return (f"interrupted after step {trainer.step_index} of {steps}; {resume_point(trainer.run_dir)}; "
            f"continue with: {command}")


def resume_point(run_dir: Path) -> str:
    """Where a resume of ``run_dir`` continues from, read off the folder (not assumed)."""
    folder = latest_checkpoint(run_dir)
    if folder is None:
        return "no checkpoint was written yet, so a resume starts over from step 0"
    return f"the last checkpoint is {folder} (step {checkpoint_step(folder)}), where a resume continues"


@contextmanager
def truthful_stop(trainer: Trainer) -> Iterator[None]:
    """A run stopped by a failing tool or verifier: its one line ends with :func:`resume_point`."""
    try:
        yield
    except (ToolHealthError, VerifierError) as err:
        raise type(err)(f"{err}; {resume_point(trainer.run_dir)}") from err


def console_run(trainer: Trainer, steps: int, train: Callable[[], list[dict[str, Any]]],
                write: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """``train()`` between the console's header and footer, with one progress line per record.

    ``trainer.echo`` shows each record while ``train`` runs (restored after); the run's plot
    (``log.plot``) is written before the footer, which names it. ``write`` takes one line (default:
    stdout, flushed): ``tracerl train`` and ``trainer().run()`` print the same lines.
    """
    write = write or _stdout
    width = terminal_width()
    parameters = sum(p.numel() for p in trainer.model.parameters())
    model = trainer.config.model
    write(header(trainer.config, trainer.run_dir, parameters, trainer.step_index, width=width,
                 format_why=format_reason(model.format, model.name_or_path)))
    start, first, echo = time.perf_counter(), trainer.step_index, trainer.echo

    def show(record: dict[str, Any]) -> None:
        done = int(record["step"]) - first
        write(progress_line(record, steps, time.perf_counter() - start, done, width))

    trainer.echo, trainer.show_progress = show, True  # the rollout phase's status line too
    try:
        with truthful_stop(trainer):
            records = train()
    finally:
        trainer.echo, trainer.show_progress = echo, False
    plot = write_plot(trainer) if records else None
    write(footer(records, latest_checkpoint(trainer.run_dir), width=width, plot=plot))
    return records


def plots(config: TrainConfig) -> bool:
    """``log.plot``: on unless false, or null with the random tiny model (its curves say nothing)."""
    wanted = config.log.plot
    return wanted if wanted is not None else config.model.name_or_path != "random-tiny"


def write_plot(trainer: Trainer) -> Path | None:
    """``RUN_DIR/plot.png`` from the run's ``metrics.jsonl`` when :func:`plots`; returns its path."""
    if not plots(trainer.config):
        return None
    from tracerl.view.plot import plot_runs  # matplotlib: imported only when a plot is drawn

    target = trainer.run_dir / "plot.png"
    tmp = trainer.run_dir / f".plot.{os.getpid()}.png"  # drawn aside, then renamed: a link named plot.png
    plot_runs([trainer.run_dir], tmp)  # is replaced, never written through
    os.replace(tmp, target)
    return target


def _stdout(line: str) -> None:
    print(line, flush=True)
