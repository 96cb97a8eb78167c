"""Atomic ``tracerl data convert`` outputs, and the manifest that lets readers trust them.

A conversion writes ``tasks.jsonl``, ``eval_tasks.jsonl`` and ``corpus.jsonl`` together; a
kill or a full disk must leave either the previous set or the new one, never a file cut at a
line boundary (it parses, so nothing else would notice). Each file is written complete under
a temporary name first (a failure there leaves the previous outputs untouched); then
``convert_manifest.json`` is marked ``converting``, the files are renamed into place, and the
manifest is rewritten ``complete`` with each file's record count, size and sha256.

Readers (:func:`check_manifest`, called by :func:`tracerl.envs.data.load_tasks` and
``load_corpus``, so by ``env-check``, training and evaluation) refuse a file whose folder's
manifest says ``converting`` (a conversion was interrupted) or whose size or hash differ from
the manifest's (torn or edited since). A file with no manifest beside it (written by hand) is
read as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracerl.atomic import fsync_dir, open_temp, write_atomic
from tracerl.atomic import remove_stale_temps as _remove_stale_temps
from tracerl.envs.bounded import MiB, TooLarge, open_regular, read_limited
from tracerl.errors import UserError

MANIFEST = "convert_manifest.json"
_KIND = "tracerl data convert"


def write_temp_lines(path: Path, records: Iterable[dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """Write ``records`` as JSONL to ``path``'s temporary sibling, durably.

    Returns the temporary path and its manifest entry ``{"records", "bytes", "sha256"}``;
    a failure (a full disk) removes the temporary and leaves ``path`` as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp, fd), digest, count, size = open_temp(path), hashlib.sha256(), 0, 0
    try:
        with os.fdopen(fd, "wb") as handle:
            for record in records:
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
                handle.write(line)
                digest.update(line)
                count, size = count + 1, size + len(line)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, {"records": count, "bytes": size, "sha256": digest.hexdigest()}


def _write_manifest(out: Path, status: str, files: dict[str, dict[str, Any]]) -> None:
    text = json.dumps({"kind": _KIND, "status": status, "files": files}, indent=2, sort_keys=True) + "\n"
    write_atomic(out / MANIFEST, text.encode())


def publish(out: Path, temps: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """Rename the written temporaries (file name -> (temp, entry)) into ``out`` under the manifest.

    Between the two manifest writes the folder says ``converting``: a kill there leaves a
    mixed set that readers refuse until the conversion is run again.
    """
    entries = {name: entry for name, (_, entry) in temps.items()}
    _write_manifest(out, "converting", entries)
    for name, (tmp, _) in temps.items():
        os.replace(tmp, out / name)
    fsync_dir(out)
    _write_manifest(out, "complete", entries)


def remove_temps(temps: Iterable[Path]) -> None:
    """Remove this process's temporaries ``temps`` (after a failed conversion)."""
    for tmp in temps:
        tmp.unlink(missing_ok=True)


def check_manifest(path: Path) -> int | None:
    """Check ``path`` against its folder's convert manifest; the expected record count, or None.

    None when there is no manifest or it does not list ``path`` (a hand-written file).
    Raises :class:`UserError` naming the file when a conversion was interrupted or the file
    differs from what was converted.
    """
    manifest = path.parent / MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(read_limited(manifest, 1 * MiB, "manifest"))
        entry = data["files"].get(path.name) if data.get("kind") == _KIND else None
        status = data["status"]
        if not isinstance(status, str) or len(status) > 40:
            raise TypeError("status")
    except (TooLarge, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise UserError(f"{manifest} is damaged; run tracerl data convert again (or delete it)") from None
    if entry is None:
        return None
    _check_entry(manifest, path.name, entry)
    if status != "complete":
        raise UserError(f"{path}: a tracerl data convert into {path.parent} was interrupted ({manifest} says "
                        f"{status!r}); run the conversion again")
    size = path.stat().st_size
    if size != entry.get("bytes") or _sha256(path) != entry.get("sha256"):
        raise UserError(f"{path} differs from what tracerl data convert wrote ({size} bytes, {manifest} records "
                        f"{entry.get('bytes')} and a sha256): torn or edited since; convert again, or delete "
                        f"{manifest} if the edit is yours")
    return int(entry["records"])


def _check_entry(manifest: Path, name: str, entry: Any) -> None:
    """Raise :class:`UserError` naming the field when a manifest entry is not what convert writes."""
    if not isinstance(entry, dict):
        raise UserError(f"{manifest}: files.{name} must be an object, got {type(entry).__name__}; the manifest is "
                        "damaged: run tracerl data convert again (or delete it)")
    for key, kind in (("records", int), ("bytes", int), ("sha256", str)):
        value = entry.get(key)
        counted = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not (counted if kind is int else isinstance(value, str)):
            raise UserError(f"{manifest}: files.{name}.{key} must be {'a non-negative integer' if kind is int else 'a string'}, "
                            f"got {type(value).__name__}; the manifest is damaged: run tracerl data convert again "
                            "(or delete it)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        for block in iter(lambda: handle.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def remove_stale_temps(out: Path) -> list[str]:
    """Remove the temporaries that killed tracerl writers left in ``out`` (dead pids only: another
    conversion may be writing there now); a user's files, whatever their names, stay."""
    return _remove_stale_temps(out, holding_lock=False)
