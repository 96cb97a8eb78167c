"""Loading nested config dataclasses from YAML plus ``a.b=value`` overrides.

Typing and nesting are delegated to ``dacite``; this module adds what users need on top:
unknown keys named with their full path and the valid alternatives, and values parsed the
way YAML would parse them on the command line.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import typing
from pathlib import Path
from typing import Any, TypeVar

import dacite
import yaml

from tracerl.envs.bounded import MiB, printable, read_limited
from tracerl.errors import UserError
from tracerl.config.yaml_safe import YamlBombError, load_bounded

T = TypeVar("T")
MAX_CONFIG_BYTES = 1 * MiB
"""Largest config file read (``--config``, a run folder's ``config.yaml``); a full config is ~3 KB."""


class ConfigError(UserError):
    """A config that cannot be loaded; the message names the field.

    The message may quote a stranger's file (an unknown key, a value): its terminal control
    characters are escaped, so printing it cannot retitle or clear the terminal."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


def _dataclass_type(tp: Any) -> type | None:
    """The dataclass inside ``tp`` (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp  # type: ignore[return-value]
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg  # type: ignore[return-value]
    return None


def check_keys(cls: type, data: dict[str, Any], path: str = "") -> None:
    """Raise :class:`ConfigError` for keys that are not fields, recursing into nested configs."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{path or '<root>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        if key not in names:
            raise ConfigError(
                f"unknown config key '{where}'; valid keys in '{path or '<root>'}': {', '.join(names)}"
            )
        nested = _dataclass_type(hints[key])
        if nested is not None and value is not None:
            check_keys(nested, value, where)


def _as_float(value: Any) -> Any:
    # YAML reads `1` and `1e-5` differently; a float field should accept both.
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from plain data; every error names the offending field."""
    check_keys(cls, data)
    try:
        return dacite.from_dict(
            cls, data, config=dacite.Config(strict=True, cast=[tuple], type_hooks={float: _as_float})
        )
    except dacite.DaciteFieldError as err:
        raise ConfigError(f"bad config value: {err}") from None
    except dacite.DaciteError as err:
        raise ConfigError(f"bad config: {err}") from None
    except (ValueError, TypeError) as err:  # raised by a dataclass __post_init__
        raise ConfigError(_named(cls, err)) from None


def _named(cls: type, err: Exception) -> str:
    """The error of a nested section's ``__post_init__``, with the section's dotted path in it."""
    message = with_field_paths(cls, str(err))
    frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)]
    paths = section_paths(cls)
    for frame in reversed(frames):  # the innermost config object that raised
        owner = frame.f_locals.get("self")
        if dataclasses.is_dataclass(owner) and type(owner).__name__ in paths:
            path = paths[type(owner).__name__]
            if f"{path}." in message:
                return message
            first = message.split(" ", 1)[0]  # "omega must be ..." names a field of the section
            names = {f.name for f in dataclasses.fields(owner)}
            return f"{path}.{message}" if first in names else f"{path}: {message}"
    return message


def section_paths(cls: type, path: str = "") -> dict[str, str]:
    """Class name -> dotted path of every nested config section (``EngineConfig`` -> ``rollout.engine``)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        nested = _dataclass_type(hints[f.name])
        if nested is not None:
            where = f"{path}.{f.name}" if path else f.name
            out.setdefault(nested.__name__, where)
            out.update({k: v for k, v in section_paths(nested, where).items() if k not in out})
    return out


def with_field_paths(cls: type, message: str) -> str:
    """Rewrite ``EngineConfig.max_turns`` in a nested section's error as ``rollout.engine.max_turns``.

    Sections such as the rollout engine validate themselves under their class name; the user
    writes the dotted path, so the message should name that.
    """
    for name, path in section_paths(cls).items():
        message = re.sub(rf"\b{name}\.(?=\w)", f"{path}.", message)
    return message


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested data (tuples as lists) ready for YAML or JSON."""
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict update that returns a new dict."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """``"optim.lr=1e-5"`` -> ``{"optim": {"lr": 1e-05}}`` (the value is parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = load_bounded(raw) if raw.strip() else ""
    except (yaml.YAMLError, YamlBombError) as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits (Python's conversion limit)
        raise ConfigError(f"override {key.strip()}: the value ({len(raw)} characters) cannot be read as "
                          f"a number ({err})") from None
    nested: dict[str, Any] = {parts[-1]: _yaml_number(value)}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def _yaml_number(value: Any) -> Any:
    # PyYAML (YAML 1.1) reads "1e-5" as a string; users mean a number.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") and value.strip() else value
        except ValueError:
            return value
    return value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, naming the file on error."""
    try:
        data = parse_yaml(read_limited(path, MAX_CONFIG_BYTES, "config file").decode("utf-8"), path) or {}
    except UserError as err:  # too large, or not a regular file (a FIFO: refused before it is opened)
        raise ConfigError(str(err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return {k: _numbers_in(v) for k, v in data.items()}


def parse_yaml(text: str, source: str | Path) -> Any:
    """Parse config YAML with bounds (config/yaml_safe.py); errors name ``source``."""
    try:
        return load_bounded(text)
    except YamlBombError as err:
        raise ConfigError(f"config file {source} refused: it {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {source} is not valid YAML ({' '.join(str(err).split())})") from None
    except ValueError as err:  # e.g. an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"config file {source}: {_unreadable_number(text) or 'a value'} cannot be read "
                          f"({' '.join(str(err).split()[:8])}...)") from None


def _unreadable_number(text: str) -> str | None:
    """``field 'a.b' (line N)`` of the first scalar too long to be a number, found on the composed
    (not constructed) document, which the bounded loader has already parsed once."""
    def walk(node: Any, path: str) -> str | None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                found = walk(value, f"{path}.{key.value}" if path else str(key.value))
                if found:
                    return found
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                found = walk(item, f"{path}[{i}]")
                if found:
                    return found
        elif isinstance(node, yaml.ScalarNode) and len(node.value) > 4000:
            return f"field {path!r} (line {node.start_mark.line + 1}, {len(node.value)} characters)"
        return None
    try:
        return walk(yaml.compose(text, Loader=yaml.SafeLoader), "")
    except yaml.YAMLError:
        return None


def _numbers_in(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _numbers_in(v) for k, v in value.items()}
    return _yaml_number(value)
