"""The tiny base models shipped inside the package, one folder per preset, pinned by a manifest.

Pretraining is deterministic for a config on one machine and thread count, not across machines
(kernels and thread counts reorder float sums), so a base model pretrained on first use differed
from machine to machine and every testbed figure hung on an unrecorded draw. The presets that the
demo, ``--smoke`` and the benchmarks use are therefore pretrained once and shipped:

``tracerl/testbed/weights/<preset>/`` holds the Hugging Face folder (``model.safetensors``, config,
tokenizer), ``tiny_config.json`` and ``pretrain_log.json`` as pretraining wrote them, and
``manifest.json``: the preset's config hash (:meth:`TinyModelConfig.hash`), the sha256 and size of
the weights file, precision, parameter count, the torch version, thread count and device that made
them, and the command that re-makes them (``tracerl pretrain --preset <preset> --ship``).

Loading (:func:`find_shipped`) matches a config to a shipped folder by its hash and checks the
weights' sha256 before handing the folder out; a config that matches no manifest is pretrained
(and cached) as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from tracerl.errors import UserError
from tracerl.testbed.tiny_config import TinyModelConfig, get_preset

__all__ = ["MANIFEST", "SHIPPED_PRESETS", "WEIGHTS_FILE", "check_shipped", "file_sha256", "find_shipped",
           "read_manifest", "ship_preset", "weights_root"]

MANIFEST = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
SHIPPED_PRESETS = ("smoke", "default", "bench_hops", "bench_hops_lookalike")
"""The presets the package ships: ``--smoke``'s, the demo's, the credit testbed's and its look-alike
variant's (benchmarks/common.py ``CREDIT_SETTING`` and ``LOOKALIKE_SETTING``)."""
FOLDER_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja", "tiny_config.json", "pretrain_log.json")
"""What pretraining writes and a shipped folder keeps (``manifest.json`` is added beside them)."""

_VERIFIED: dict[tuple[str, int, int], str] = {}
"""sha256 of weights files already read in this process, keyed by (path, size, mtime)."""


def weights_root() -> Path:
    """``tracerl/testbed/weights`` of the installed package (the source tree in an editable install)."""
    return Path(str(resources.files("tracerl.testbed") / "weights"))


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (memoised per path, size and modification time)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _VERIFIED[key] = digest.hexdigest()
    return _VERIFIED[key]


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a shipped folder, or ``None`` when it has none; a damaged one is one line."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not a readable manifest ({err}); reinstall tracerl") from None
    if not isinstance(manifest, dict) or not all(k in manifest for k in ("preset", "config_hash", "sha256")):
        raise UserError(f"{path}: manifest lacks preset, config_hash or sha256; reinstall tracerl")
    return manifest


def _refresh_hint(preset: str) -> str:
    return f"re-make it with `tracerl pretrain --preset {preset} --ship` or reinstall tracerl"


def find_shipped(config: TinyModelConfig, root: Path | None = None) -> Path | None:
    """The shipped folder whose manifest holds ``config.hash()``, its weights checked; else ``None``.

    A weights file whose sha256 differs from its manifest raises :class:`UserError` (one line naming
    the file): the shipped model was changed or damaged, and loading it would silently use another
    base model than the manifest promises.
    """
    root = weights_root() if root is None else root
    if not root.is_dir():
        return None
    wanted = config.hash()
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        manifest = read_manifest(folder)
        if manifest is None or manifest["config_hash"] != wanted:
            continue
        weights = folder / WEIGHTS_FILE
        if not weights.is_file():
            raise UserError(f"{weights}: shipped weights missing; {_refresh_hint(manifest['preset'])}")
        actual = file_sha256(weights)
        if actual != manifest["sha256"]:
            raise UserError(f"{weights}: sha256 {actual[:12]}... does not match its manifest "
                            f"({manifest['sha256'][:12]}...); {_refresh_hint(manifest['preset'])}")
        return folder
    return None


def check_shipped(preset: str, root: Path | None = None) -> list[str]:
    """Why ``preset``'s shipped folder does not pin the preset's current config (empty: it does).

    Checks the manifest's config hash against the preset, the weights' sha256 against the manifest
    and the folder's ``tiny_config.json`` against the preset. Reads files only; never pretrains.
    """
    folder = (weights_root() if root is None else root) / preset
    config = get_preset(preset)
    try:
        manifest = read_manifest(folder)
    except UserError as err:
        return [str(err)]
    if manifest is None:
        return [f"{folder / MANIFEST}: missing; {_refresh_hint(preset)}"]
    problems = []
    if manifest["config_hash"] != config.hash():
        problems.append(f"{folder / MANIFEST}: config_hash {manifest['config_hash']} but preset {preset!r} hashes to "
                        f"{config.hash()} (its config changed); {_refresh_hint(preset)}")
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        problems.append(f"{weights}: missing; {_refresh_hint(preset)}")
    elif file_sha256(weights) != manifest["sha256"]:
        problems.append(f"{weights}: sha256 does not match {folder / MANIFEST}; {_refresh_hint(preset)}")
    stored = folder / "tiny_config.json"
    if not stored.is_file() or TinyModelConfig.from_dict(json.loads(stored.read_text())) != config:
        problems.append(f"{stored}: not the config of preset {preset!r}; {_refresh_hint(preset)}")
    return problems


def ship_preset(preset: str, source: Path, command: str, root: Path | None = None) -> Path:
    """Copy a pretrained folder of ``preset`` into ``<root>/<preset>/`` with its manifest; return it.

    ``source`` is what pretraining wrote for exactly the preset's config (its ``tiny_config.json``
    must hash like the preset). The folder is assembled beside its target and renamed into place,
    so a half-written model is never shipped. ``command`` is recorded as the command that made it.
    """
    config = get_preset(preset)
    stored = TinyModelConfig.from_dict(json.loads((source / "tiny_config.json").read_text()))
    if stored.hash() != config.hash():
        raise UserError(f"{source}: holds a model of another config than preset {preset!r}; "
                        f"only a preset's own model can be shipped")
    root = weights_root() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".ship-{preset}-", dir=root))
    try:
        for name in FOLDER_FILES:
            shutil.copyfile(source / name, tmp / name)  # copyfile: plain 0644-style files, not 0600
        (tmp / MANIFEST).write_text(json.dumps(_manifest(preset, config, tmp, command), indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of an install
        target = root / preset
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root / preset


def _manifest(preset: str, config: TinyModelConfig, folder: Path, command: str) -> dict[str, Any]:
    log = json.loads((folder / "pretrain_log.json").read_text())
    weights = folder / WEIGHTS_FILE
    return {
        "preset": preset,
        "config_hash": config.hash(),
        "weights_file": WEIGHTS_FILE,
        "sha256": file_sha256(weights),
        "bytes": weights.stat().st_size,
        "precision": log.get("precision"),
        "parameters": log.get("parameters"),
        "vocab_size": log.get("vocab_size"),
        "torch": log.get("torch"),
        "threads": log.get("threads"),
        "device": log.get("device"),
        "pretrain_seconds": log.get("total_seconds"),
        "command": command,
    }
