"""The TRACE predictor's state in a verl checkpoint folder (imports no verl).

A verl checkpoint may come from someone else, so :func:`load_predictor_state` reads it with
``torch.load(weights_only=True)``: tensors and plain data only, a pickled object that would run
code is refused in one line naming the file. The file is written atomically (:mod:`tracerl.atomic`).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from tracerl.atomic import fsync_dir, open_temp
from tracerl.errors import UserError

PREDICTOR_FILE = "tracerl_predictor.pt"
"""The predictor's ``state_dict`` inside verl's checkpoint folder."""


def save_predictor_state(state: dict[str, Any], folder: str | Path) -> Path:
    """Write ``state`` to ``folder/tracerl_predictor.pt`` atomically; the file's path."""
    path = Path(folder) / PREDICTOR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = open_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def load_predictor_state(folder: str | Path) -> dict[str, Any]:
    """The state :func:`save_predictor_state` wrote in ``folder``; :class:`UserError` naming the file
    when it is missing, holds objects other than tensors and plain data, or is corrupted."""
    path = Path(folder) / PREDICTOR_FILE
    if not path.is_file():
        raise UserError(f"{path}: no tracerl predictor state in this verl checkpoint")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{path} holds objects other than tensors and plain data, refused to load "
                        f"({first[:120]}); only load checkpoints you trust") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise UserError(f"{path} is corrupted or truncated ({type(err).__name__}); restore it") from None
    if not isinstance(state, dict):
        raise UserError(f"{path} holds a {type(state).__name__}, not a predictor state_dict; restore it")
    return state
