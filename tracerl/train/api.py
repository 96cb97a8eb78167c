"""Training from Python: a preset, overrides, plain callables for the reward and the tools.

    from tracerl.train import read_metrics, trainer
    with trainer("grpo", "runs/py", overrides=["steps=3"], reward=my_reward, tools=[my_tool]) as run:
        run.run()
    read_metrics("runs/py")

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

from tracerl.core.registry import RegistryError, resolve_import_path
from tracerl.errors import UserError
from tracerl.train.loop import Trainer
from tracerl.train.preflight import checked_config
from tracerl.runs.folder import refuse_if_state
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
            steps: int | None = None, smoke: bool | str = False, config_file: str | Path | None = None) -> Trainer:
    """A :class:`~tracerl.train.loop.Trainer` for a fresh run in ``out``, checked as ``tracerl train`` checks.

    ``overrides``: ``"section.field=value"`` strings (``--set``); ``reward``: ``(answer: str, task: Task)
    -> float`` or a verifier name (``data.verifier``); ``tools``: typed functions (name, docstring and
    type hints become the schema) or import paths, added to the environment's tools (``data.tools``).
    ``smoke``: True (``--smoke``: the smoke-pretrained tiny model, react format, search/open only) or
    ``"random"`` (``--smoke-random``: a random tiny model whose vocabulary fits your tools and format).
    Use it as a context manager (``with trainer(...) as run: run.run()``) so the folder's lock is released.
    """
    sets = list(overrides)
    if reward is not None:
        sets.append(f"data.verifier={reward if isinstance(reward, str) else import_path(reward, 'reward')}")
    if tools:
        paths = [t if isinstance(t, str) else import_path(t, "tool") for t in tools]
        sets.append(f"data.tools=[{', '.join(paths)}]")
    if steps is not None:
        sets.append(f"steps={steps}")
    config, _ = checked_config(preset, config_file=config_file, overrides=sets, smoke=smoke)
    refuse_if_state(Path(out))
    pretrain_if_used(smoke, config, sys.stderr.write)  # smoke=True: says so the first time, as --smoke does
    return Trainer(config, Path(out))
