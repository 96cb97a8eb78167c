"""Training from Python: a preset, overrides, plain callables for the reward and the tools.

    from tracerl.train import read_metrics, trainer
    with trainer("grpo", "runs/py", overrides=["steps=3"], reward=my_reward, tools=[my_tool]) as run:
        run.run()  # prints the console's header, progress lines and footer (quiet=True: none)
    read_metrics("runs/py")

Running it again is refused in one line naming ``resume=True`` and ``overwrite=True``.

A callable is recorded in the run's ``config.yaml`` by its import path (``module:function``),
the form ``data.verifier`` and ``data.tools`` take on the command line, so a function must be
defined at module level (a script's functions are ``__main__:name``; resuming such a run
from the command line needs the function importable under that path).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracerl.config.loading import MAX_CONFIG_BYTES, parse_yaml, to_dict
from tracerl.config.schema import TrainConfig
from tracerl.core.registry import RegistryError, resolve_import_path
from tracerl.envs.bounded import read_limited
from tracerl.errors import UserError
from tracerl.runs.checkpoint import latest_checkpoint
from tracerl.config.resume_rule import check_resume_changes
from tracerl.runs.folder import RunFolderError, check_run_folder, run_state
from tracerl.runs.overwrite import overwrite_run_folder
from tracerl.train.loop import Trainer
from tracerl.train.preflight import checked_config
from tracerl.train.run import console_run, truthful_stop
from tracerl.train.smoke import pretrain_if_used


def import_path(fn: Callable[..., Any], what: str) -> str:
    """``module:qualname`` of a module-level function, checked to resolve back to ``fn``."""
    path = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    try:
        found = resolve_import_path(path, what)
    except RegistryError:
        found = None
    if found is not fn:
        raise UserError(f"{what} {fn!r} must be a function defined at module level (found by {path!r}); "
                        "a lambda or a nested function cannot be recorded in the run's config.yaml")
    return path


def trainer(preset: str = "grpo", out: str | Path = "runs/python", *, overrides: Sequence[str] = (),
            reward: Callable[..., float] | str | None = None, tools: Sequence[Callable[..., str] | str] = (),
            steps: int | None = None, smoke: bool | str = False, config_file: str | Path | None = None,
            resume: bool = False, overwrite: bool = False, quiet: bool = False) -> Trainer:
    """A :class:`~tracerl.train.loop.Trainer` for a run in ``out``, checked as ``tracerl train`` checks.

    ``overrides``: ``"section.field=value"`` strings (``--set``); ``reward``: ``(answer: str, task: Task)
    -> float`` or a verifier name (``data.verifier``); ``tools``: typed functions (name, docstring and
    type hints become the schema) or import paths, added to the environment's tools (``data.tools``).
    ``smoke``: True (``--smoke``: the smoke-pretrained tiny model, react format, search/open only) or
    ``"random"`` (``--smoke-random``: a random tiny model whose vocabulary fits your tools and format).
    A folder that already holds a run is refused unless ``resume=True`` (continue it from its newest
    checkpoint; the arguments may change only steps, evaluation, logging, checkpoint cadence and the
    machine, as ``tracerl train --resume``: :mod:`tracerl.config.resume_rule`; an empty folder starts
    fresh) or ``overwrite=True`` (remove the previous run there, named on stderr, and start over; files
    of your own there stay: :mod:`tracerl.runs.overwrite`).
    ``run()`` prints the console's header, a progress line per step and the footer, as ``tracerl
    train`` does, unless ``quiet``. Use it as a context manager (``with trainer(...) as run:
    run.run()``) so the folder's lock is released.
    """
    if resume and overwrite:
        raise UserError("trainer(): give resume=True (continue the run in out) or overwrite=True (start over), not both")
    sets = list(overrides)
    if reward is not None:
        sets.append(f"data.verifier={reward if isinstance(reward, str) else import_path(reward, 'reward')}")
    if tools:
        paths = [t if isinstance(t, str) else import_path(t, "tool") for t in tools]
        sets.append(f"data.tools=[{', '.join(paths)}]")
    if steps is not None:
        sets.append(f"steps={steps}")
    run_dir = Path(out)
    check_run_folder(run_dir)
    config, _ = checked_config(preset, config_file=config_file, overrides=sets, smoke=smoke)
    continuing = resume and bool(run_state(run_dir))
    if continuing:
        check_same_config(config, run_dir)
    elif overwrite:
        overwrite_run_folder(run_dir, notify=lambda line: print(line, file=sys.stderr, flush=True))
    elif run_state(run_dir):
        raise RunFolderError(f"{run_dir} already holds run state ({', '.join(run_state(run_dir))}); continue it "
                             "with trainer(..., resume=True), start over with overwrite=True, or choose another out")
    pretrain_if_used(smoke, config, sys.stderr.write)  # smoke=True: says so the first time, as --smoke does
    return ConsoleTrainer(config, run_dir, resume=continuing, quiet=quiet)


class ConsoleTrainer(Trainer):
    """A :class:`~tracerl.train.loop.Trainer` whose :meth:`run` prints what ``tracerl train`` prints."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False, quiet: bool = False) -> None:
        self.quiet = quiet
        super().__init__(config, run_dir, resume=resume)

    def run(self, steps: int | None = None, *, deadline: float | None = None) -> list[dict[str, Any]]:
        """:meth:`Trainer.run <tracerl.train.loop.Trainer.run>`, between the console's header and footer."""
        train = super().run
        if self.quiet:
            with truthful_stop(self):  # a stop by failing tools names the checkpoint a resume continues from
                return train(steps, deadline=deadline)
        target = self.config.steps if steps is None else steps
        return console_run(self, target, lambda: train(steps, deadline=deadline))


def check_same_config(config: TrainConfig, run_dir: Path) -> TrainConfig:
    """``resume=True``: the arguments may change only what a resume may change
    (:data:`~tracerl.config.resume_rule.RESUME_MUTABLE`: steps, evaluation, logging, checkpoint cadence,
    the machine), the rule ``tracerl train --resume`` applies; compared as data, nothing the folder
    names is imported. Returns ``config`` (its mutable changes are what the run continues with)."""
    folder = latest_checkpoint(run_dir)
    source = (folder if folder is not None else run_dir) / "config.yaml"
    if not source.is_file():
        raise RunFolderError(f"{run_dir} has no checkpoint and no config.yaml: not a tracerl run folder")
    saved = parse_yaml(read_limited(source, MAX_CONFIG_BYTES, "config file").decode("utf-8"), source)
    check_resume_changes(saved, to_dict(config), run_dir, "overwrite=True or another out")
    done = int(folder.name.removeprefix("ckpt-")) if folder is not None else 0
    if config.steps <= done:
        raise UserError(f"{run_dir} is already at step {done} and steps = {config.steps} asks for no more; pass "
                        f"steps above {done} to continue it, or overwrite=True to start over")
    return config
