"""A checkpoint's config must name the model the run started from.

The weights a run resumes come from ``initial/`` and the checkpoint's ``policy/``; the model named
by its config (``preset``, ``model.name_or_path``, ``model.tiny_preset``) only labels them (the
header, the plots, ``view``). A checkpoint ``config.yaml`` whose model fields were edited was
accepted, and the run's header named the wrong model. The start's own ``RUN/config.yaml``, written
once when the run began, is the record: a checkpoint's model fields must equal it. Both are read as
plain YAML (bounded, nothing imported: a stranger's plug-in paths are not resolved here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.config.loading import MAX_CONFIG_BYTES, ConfigError, parse_yaml
from tracerl.envs.bounded import TooLarge, printable, read_limited
from tracerl.runs.folder import RunFolderError

IDENTITY = ("preset", "model.name_or_path", "model.tiny_preset")
"""The fields that say which model a run trains; none may differ between the start and a checkpoint."""


def check_same_model(run_dir: Path, checkpoint: Path) -> None:
    """Refuse (one :class:`RunFolderError` line naming the file and the field) a ``checkpoint`` whose
    ``config.yaml`` names another model than ``run_dir/config.yaml``; nothing when either is absent."""
    start, saved = run_dir / "config.yaml", checkpoint / "config.yaml"
    if not start.is_file() or not saved.is_file():
        return
    began, now = _raw(start), _raw(saved)
    for field in IDENTITY:
        first, second = _get(began, field), _get(now, field)
        if first != second:
            raise RunFolderError(f"{saved}: {field} = {_shown(second)} but the run started with {_shown(first)} "
                                 f"({start}); a run's model cannot change: restore the checkpoint's config.yaml")


def _raw(path: Path) -> dict[str, Any]:
    try:
        text = read_limited(path, MAX_CONFIG_BYTES, "config file").decode("utf-8", errors="replace")
    except TooLarge as err:
        raise ConfigError(str(err)) from None
    data = parse_yaml(text, path)
    return data if isinstance(data, dict) else {}


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _shown(value: Any) -> str:
    text = repr(value)
    return printable(text if len(text) <= 80 else text[:80] + "...")
