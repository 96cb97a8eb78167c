"""What a resumed run may change: one list of keys and one check, shared by ``tracerl train --resume``
and ``trainer(..., resume=True)``.

A resume continues a run exactly: its weights, optimiser, sampler and data cursor come from the
checkpoint. What only decides how long it trains, how it is evaluated, logged and checkpointed,
and where it runs may change mid-run (:data:`RESUME_MUTABLE`); any other change (the learning
rate, the preset, the data) would make the continued run a different experiment under the old
run's name, so it is refused in one line naming every such key with the run's value and the new
one. The two configs are compared as plain data, so nothing a run folder names is imported here.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tracerl.errors import UserError

RESUME_MUTABLE: tuple[str, ...] = (
    "steps",
    "eval.every", "eval.size", "eval.temperature", "eval.at_start",
    "log.tensorboard", "log.plot", "log.wandb", "log.wandb_project", "log.wandb_entity", "log.rollouts",
    "log.checkpoint_every", "log.keep_last",
    "dist.nproc", "dist.backend", "dist.timeout_s", "dist.mixed_precision",  # a sharded run resumes at any count
    "model.device", "model.threads",  # the machine it continues on (``--device``)
    "data.retriever_url",  # where the retrieval server listens now (restarted elsewhere after a crash)
)
"""Dotted config keys a resume may change: the length of the run, evaluation, logging and checkpoint
cadence, and the machine. Every other key must keep the value the run was started with."""

SHOWN = 6
"""Refused keys named in the message (the rest are counted): the line must stay one line."""


def mutable(key: str) -> bool:
    """Whether the dotted ``key`` may change on resume."""
    return key in RESUME_MUTABLE


def differences(saved: Any, given: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every dotted leaf key whose value differs between two config dicts, as ``(key, saved, given)``,
    in the order of ``given``. A key only one side has (a run saved by another tracerl version) is no
    difference; lists and tuples compare as lists."""
    if isinstance(saved, dict) and isinstance(given, dict):
        found: list[tuple[str, Any, Any]] = []
        for key in [k for k in given if k in saved]:
            found += differences(saved[key], given[key], f"{prefix}{key}.")
        return found
    if isinstance(saved, (list, tuple)) and isinstance(given, (list, tuple)):
        saved, given = list(saved), list(given)
    return [] if saved == given else [(prefix.rstrip("."), saved, given)]


def check_resume_changes(saved: dict[str, Any], given: dict[str, Any], run_dir: Any, start_over: str) -> list[str]:
    """Refuse (one :class:`UserError` line) a resume whose config ``given`` differs from the run's
    ``saved`` one outside :data:`RESUME_MUTABLE`, naming each such key with both values; returns the
    mutable keys that change (what the resume applies). ``start_over``: how this interface starts a
    new run instead (``"--out NEW_DIR"``, ``"overwrite=True"``)."""
    found = differences(saved, given)
    refused = [(key, was, now) for key, was, now in found if not mutable(key)]
    if refused:
        shown = ", ".join(f"{key} (run: {was!r}, given: {now!r})" for key, was, now in refused[:SHOWN])
        more = f" and {len(refused) - SHOWN} more" if len(refused) > SHOWN else ""
        raise UserError(f"resuming {run_dir} cannot change {shown}{more}: a resume may change only "
                        f"{mutable_summary()}; drop the change, or start a new run with {start_over}")
    return [key for key, _, _ in found]


def mutable_summary() -> str:
    """:data:`RESUME_MUTABLE` in short: ``section.*`` where every field of a section may change."""
    from tracerl.config.schema import TrainConfig  # the schema imports the checks; this module stays below it

    hints = typing.get_type_hints(TrainConfig)
    parts: list[str] = []
    for key in RESUME_MUTABLE:
        section = key.split(".")[0]
        if "." in key and dataclasses.is_dataclass(hints.get(section)):
            names = [f.name for f in dataclasses.fields(hints[section])]
            if all(f"{section}.{name}" in RESUME_MUTABLE for name in names):
                key = f"{section}.*"
        if key not in parts:
            parts.append(key)
    return ", ".join(parts)
