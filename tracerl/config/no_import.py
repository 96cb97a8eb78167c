"""Reading someone else's config without running it: ``tracerl config show --no-import``.

A config names plug-ins by import path (``data.verifier: their_pkg.rewards:judge``) and building
the config imports them: the import paths of a config file are code, trusted as much as the
file. ``config show`` and ``train`` therefore import whatever a ``--config`` names. To read a
config from someone else first, :func:`unresolved_yaml` layers it exactly as ``train`` would
(defaults, preset, smoke overlay, file, ``--set``) and prints the result without building the
config: nothing is imported and nothing is checked; each import path is listed so the reader
sees what would run. (A run folder's ``config.yaml`` is refused without ``--trust-run-code``
for the same reason: runs/run_config.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tracerl.core.registry import is_import_path
from tracerl.config.data_source import infer_data_source
from tracerl.config.loading import ConfigError, load_yaml, merge, parse_override, to_dict
from tracerl.config.presets import PRESETS, smoke_overlay
from tracerl.envs.bounded import printable

PLUGIN_FIELDS = ("data.verifier", "data.environment", "data.tools", "model.format", "rollout.scheme",
                 "algo.estimator")
"""Config fields whose value may be a ``package.module:attribute`` path (imported when the config is built)."""


def unresolved_data(preset: str, *, config_file: str | Path | None = None, overrides: list[str] | None = None,
                    smoke: bool | str = False) -> dict[str, Any]:
    """The layered config data of :func:`~tracerl.config.schema.resolve_config`, not built (no import)."""
    from tracerl.config.schema import TrainConfig  # the defaults: built-in code only

    if preset not in PRESETS:
        from tracerl.config.preset_help import unknown_preset  # did-you-mean and every name

        raise ConfigError(unknown_preset(preset))
    data: dict[str, Any] = merge(to_dict(TrainConfig()), {"preset": preset, **PRESETS[preset]})
    overlay = smoke_overlay(smoke)
    if overlay is not None:
        data = merge(data, overlay)
    user: dict[str, Any] = load_yaml(config_file) if config_file else {}
    for text in overrides or []:
        user = merge(user, parse_override(text))
    return merge(data, infer_data_source(user))


def import_paths(data: Any) -> list[tuple[str, str]]:
    """``(field, path)`` of every import path in the plug-in fields of raw config data."""
    found = []
    for dotted in PLUGIN_FIELDS:
        value: Any = data
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and is_import_path(item):
                found.append((dotted, item))
    return found


def unresolved_yaml(preset: str, **layers: Any) -> str:
    """The layered config as YAML, headed by a comment naming the import paths it would run."""
    data = unresolved_data(preset, **layers)
    paths = import_paths(data)
    head = ["# not built: nothing imported, nothing checked (tracerl config show --no-import)"]
    head += [f"# {field} = {path!r} would import and run code when the config is built" for field, path in paths]
    return printable("\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False))
