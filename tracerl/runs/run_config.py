"""Reading a run folder's ``config.yaml`` when the folder may come from someone else.

A config names plug-ins by import path (``data.verifier: my_pkg.rewards:judge``), and building
the config imports them (validation resolves each path), so loading a stranger's run folder
(``tracerl train --resume``, ``tracerl eval --run``) would run whatever module its config names,
even one shipped inside the archive. Here such paths are refused before anything is imported,
naming the field, unless the user passes ``--trust-run-code``. Built-in names (``em``,
``search``, ``react``...) need no trust. The file is read bounded (size and YAML expansion:
config/loading.py, config/yaml_safe.py) and must be a plain file of the folder, not a link.
"""

from __future__ import annotations

from pathlib import Path

from tracerl.envs.bounded import TooLarge, read_limited
from tracerl.config.schema import TrainConfig
from tracerl.config.loading import MAX_CONFIG_BYTES, ConfigError, from_dict, parse_yaml
from tracerl.config.no_import import PLUGIN_FIELDS, import_paths
from tracerl.runs.folder import RunFolderError

__all__ = ["PLUGIN_FIELDS", "TRUST_FLAG", "import_paths", "read_run_config"]

TRUST_FLAG = "--trust-run-code"


def read_run_config(path: Path, *, trust_code: bool = False) -> TrainConfig:
    """The :class:`TrainConfig` of a run folder's ``config.yaml`` (or a checkpoint's), read safely.

    Raises :class:`RunFolderError` naming the first plug-in field that would import code, unless
    ``trust_code``; :class:`ConfigError` for a file that is not a bounded, valid config.
    """
    path = Path(path)
    if path.is_symlink():
        raise RunFolderError(f"{path} is a symbolic link; a run folder must hold its own files: remove the link")
    try:
        text = read_limited(path, MAX_CONFIG_BYTES, "config file").decode("utf-8")
    except TooLarge as err:
        raise ConfigError(str(err)) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not valid UTF-8 ({err.reason} at byte {err.start}); restore it") from None
    data = parse_yaml(text, path)
    paths = import_paths(data)
    if paths and not trust_code:
        field, value = paths[0]
        raise RunFolderError(f"{path}: {field} = {value!r} would import and run code named by the run folder; "
                             f"pass {TRUST_FLAG} if you trust where this folder came from")
    return from_dict(TrainConfig, data)
