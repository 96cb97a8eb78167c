"""Sharded model and optimiser state through torch.distributed.checkpoint (DCP).

A checkpoint written by N ranks holds each rank's shards plus DCP's metadata, keyed by fully
qualified parameter names, so it loads into any process count: N, M, or one process with a plain
(unsharded) model and optimiser. That is how a run saved at ``--nproc 2`` resumes at 1.

Layout inside a checkpoint folder (beside ``policy/``, ``trainer.pt``, ``config.yaml``)::

    dcp/    .metadata and __N_0.distcp files: {"model": ..., "optim": ...}

Every rank calls :func:`save_sharded` and :func:`load_sharded` (they are collectives when a
process group is up); without one they run in this process alone. torch.distributed.checkpoint
is imported only when one of them runs, so the one-process path never loads it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from tracerl.errors import UserError

DCP_FOLDER = "dcp"
"""Sub-folder of a checkpoint with the sharded model and optimiser."""


def has_sharded(folder: Path) -> bool:
    """Whether checkpoint ``folder`` holds DCP state (``dcp/.metadata``)."""
    return (Path(folder) / DCP_FOLDER / ".metadata").is_file()


def save_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Write ``model`` and ``optimizer`` (sharded or not) under ``path`` (a ``dcp/`` folder)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))


def load_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Load ``path`` (written by :func:`save_sharded` at any process count) into ``model`` and
    ``optimizer`` in place, resharding to this run's layout.

    Nothing a stranger wrote is unpickled (:mod:`tracerl.runs.safe_dcp`). A missing, truncated or
    damaged ``.metadata`` or shard, or shards that do not fit this model, end in one
    :class:`CheckpointStateError` line naming the folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from tracerl.runs.safe_dcp import SafePlanner, SafeReader

    model_state, optim_state = get_state_dict(model, optimizer)  # the target layout (and its keys)
    state = {"model": model_state, "optim": optim_state}
    reader = SafeReader(str(path))
    try:
        reader.read_metadata()  # first, alone: a bad metadata ends here in one line, before DCP logs it
        with warnings.catch_warnings():  # one process on purpose (a resume at --nproc 1)
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=SafePlanner())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException, tracebacks inside
        if reader.failure is not None:
            raise reader.failure from None
        cause = _first_cause(err)
        text = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else ""
        raise CheckpointStateError(f"{path}: the sharded checkpoint cannot be loaded "
                                   f"({type(cause).__name__}{': ' + text if text else ''})") from None


def _first_cause(err: BaseException) -> BaseException:
    """The error inside a DCP failure (``CheckpointException.failures``: a rank's exception)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))  # (exception, traceback) in torch 2.13
        first = first[0] if isinstance(first, tuple) and first else getattr(first, "exception", first)
        return first if isinstance(first, BaseException) else err
    return err


def load_sharded_state(folder: Path, model: Any, optimizer: Any, driver: Any | None) -> None:
    """Resume model and optimiser from checkpoint ``folder``'s ``dcp/`` (written at any process count).

    ``driver``: rank 0's :class:`~tracerl.distributed.trainer.Driver` (every rank loads its shards),
    or None to load into this one process's plain model and optimiser.
    """
    path = Path(folder) / DCP_FOLDER
    if not (path / ".metadata").is_file():
        raise CheckpointStateError(f"{folder} was written by one process (no {DCP_FOLDER}/ with the sharded "
                                   "optimiser); resume it with --nproc 1")
    if driver is not None:
        driver.load(path)
        return
    load_sharded(path, model, optimizer)


class CheckpointStateError(UserError):
    """A checkpoint cannot be resumed at this process count."""
