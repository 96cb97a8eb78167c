"""The run's initial policy (``RUN_DIR/initial/``): a reference to an on-disk base model, or a copy.

The frozen reference and a resumed run are rebuilt from the initial policy, so it must be
found again exactly. A base model that is an on-disk folder is not copied into every run
(a 0.6B model would add 1.2 GB per run): ``initial/reference.json`` records its resolved path
and a fingerprint (a hash of ``config.json`` and the names, sizes and mtimes of its files),
and resume fails with a clear message when that folder changed or vanished.

Everything else is copied (``save_pretrained``): ``random-tiny`` exists only in memory, a
Hub name may resolve to another revision later, and the embedded ``tiny`` model (about
0.3 MB) is rebuilt bit-exactly only on the same machine and thread count, so a reference to
its cache could not be trusted.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from tracerl.atomic import make_temp_dir, publish_dir
from tracerl.envs.bounded import loads_json, read_limited
from tracerl.runs.checkpoint import fsync_tree
from tracerl.runs.folder import RunFolderError, write_atomic

REFERENCE_FILE = "reference.json"
MAX_REFERENCE_BYTES = 1 << 20
"""Largest ``reference.json`` read (one path and a fingerprint of a few hundred bytes per file)."""


def is_referable(name_or_path: str) -> bool:
    """Whether ``model.name_or_path`` is an on-disk folder that can be found again (not copied)."""
    return name_or_path not in ("tiny", "random-tiny") and Path(name_or_path).is_dir()


def fingerprint(folder: Path) -> dict[str, Any]:
    """What identifies a model folder's content cheaply: ``config.json``'s sha256 and each top-level
    file's ``[size, mtime_ns]`` (a rewritten weights file changes its mtime)."""
    folder = Path(folder)
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a model folder")
    files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns]
             for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}
    return {"config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(), "files": files}


def has_initial(initial: Path) -> bool:
    """Whether ``initial/`` holds a complete copy or a reference."""
    return (initial / "config.json").is_file() or (initial / REFERENCE_FILE).is_file()


def write_initial(initial: Path, model: Any, tokenizer: Any, name_or_path: str) -> None:
    """Write ``initial/`` atomically: a reference for an on-disk folder, else a full copy."""
    tmp = make_temp_dir(initial)  # exclusively, with tracerl's marker (removed when published)
    try:
        if is_referable(name_or_path):
            source = Path(name_or_path).resolve()
            record = {"path": str(source), "fingerprint": fingerprint(source)}
            write_atomic(tmp / REFERENCE_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        else:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)  # HF writers do not fsync: make the content durable before the rename publishes it
        publish_dir(tmp, initial)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary only
        raise


def initial_source(initial: Path) -> str:
    """The folder to load the initial policy from: ``initial/`` itself, or the checked reference.

    Raises :class:`RunFolderError` when the referenced folder vanished or its content changed.
    """
    ref = initial / REFERENCE_FILE
    if not ref.is_file():
        return str(initial)
    try:
        record = loads_json(read_limited(ref, MAX_REFERENCE_BYTES, "reference file"))
    except (OSError, ValueError) as err:
        raise RunFolderError(f"{ref} is damaged ({type(err).__name__}); the run cannot be resumed") from None
    source, expected = _checked_reference(record, ref)
    if not (source / "config.json").is_file():
        raise RunFolderError(f"the base model of this run, {source} (named in {ref}), is gone; "
                             "put it back at that path to resume")
    found = fingerprint(source)
    if found != expected:
        changed = _changed(found, expected)
        raise RunFolderError(f"the base model of this run, {source} (named in {ref}), changed since the run "
                             f"started ({', '.join(changed)}); the frozen reference would differ, so the run "
                             "cannot be resumed: restore the folder or start a new run")
    return str(source)


def _checked_reference(record: Any, ref: Path) -> tuple[Path, dict[str, Any]]:
    """``(path, fingerprint)`` of a reference record, each field's type checked (a crafted file
    would otherwise fail deep in the comparison); :class:`RunFolderError` names the field."""
    def bad(field: str, what: str) -> RunFolderError:
        return RunFolderError(f"{ref}: field {field!r} must be {what}; the file is damaged, so the run cannot "
                              "be resumed")

    if not isinstance(record, dict):
        raise RunFolderError(f"{ref} must hold a JSON object; the file is damaged, so the run cannot be resumed")
    if not isinstance(record.get("path"), str) or not record["path"]:
        raise bad("path", "a folder path (a string)")
    expected = record.get("fingerprint")
    if not isinstance(expected, dict):
        raise bad("fingerprint", "an object")
    if not isinstance(expected.get("config_sha256"), str):
        raise bad("fingerprint.config_sha256", "a string")
    files = expected.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v) for v in files.values()):
        raise bad("fingerprint.files", "an object of [size, mtime_ns] integer pairs")
    return Path(record["path"]), expected


def _changed(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    names = []
    if found["config_sha256"] != expected["config_sha256"]:
        names.append("config.json")
    a, b = found["files"], expected["files"]
    names += [n for n in sorted(set(a) | set(b)) if n != "config.json" and list(a.get(n, [])) != list(b.get(n, []))]
    return names or ["its files"]
