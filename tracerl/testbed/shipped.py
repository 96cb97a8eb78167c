"""The tiny base models shipped inside the package, one folder per preset, pinned by a manifest.

Pretraining is deterministic for a config on one machine and thread count, not across machines
(kernels and thread counts reorder float sums), so a base model pretrained on first use differed
from machine to machine and every testbed figure hung on an unrecorded draw. The presets that the
demo, ``--smoke`` and the benchmarks use are therefore pretrained once and shipped:

``tracerl/testbed/weights/<preset>/`` holds the Hugging Face folder (``model.safetensors``, config,
tokenizer), ``tiny_config.json`` and ``pretrain_log.json`` as pretraining wrote them, and
``manifest.json``: the preset's config hash (:meth:`TinyModelConfig.hash`), the sha256 and size of
the weights file, the sha256 of every file of the folder (``files``: config and tokenizer too, so an
edited ``rms_norm_eps`` or ``tokenizer.json`` is caught), precision, parameter count, the torch version, thread count and device that made
them, and the command that re-makes them (``tracerl pretrain --preset <preset> --ship``).

Loading (:func:`find_shipped`) matches a config to a shipped folder by its hash and checks every
file's sha256 (each a regular file, no symlink, nothing else in the folder) before handing it out; a config that matches no manifest is pretrained
(and cached) as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from tracerl.envs.bounded import printable
from tracerl.errors import UserError
from tracerl.testbed.tiny_config import TinyModelConfig, get_preset

__all__ = ["MANIFEST", "SHIPPED_PRESETS", "WEIGHTS_FILE", "check_shipped", "file_hashes", "file_sha256", "find_shipped",
           "folder_problem", "read_manifest", "ship_preset", "weights_root"]

MANIFEST = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
SHIPPED_PRESETS = ("smoke", "default", "bench_hops", "bench_hops_lookalike", "bench_hops_clues_longer", "bench_hops_clues5")
"""The presets the package ships: ``--smoke``'s, the demo's, the credit testbed's, its look-alike
variant's (benchmarks/common.py ``CREDIT_SETTING`` and ``LOOKALIKE_SETTING``) and the long-horizon
testbed's two bases (four- and five-hop questions on the clue world: the first registration's
``bench_hops_clues_longer`` and the second's ``bench_hops_clues5``; benchmarks/science/long_horizon_pilot.py)."""
FOLDER_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja", "tiny_config.json", "pretrain_log.json")
"""What pretraining writes and a shipped folder keeps (``manifest.json`` is added beside them)."""

MAX_MANIFEST_BYTES = 64 * 1024
"""A manifest is under 2 KB; past this it is not one (and is not read whole)."""
_WORD = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

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
    """The manifest of a shipped folder, or ``None`` when it has none; a damaged one is one line.

    Read with a size cap (:data:`MAX_MANIFEST_BYTES`; a 300 MB manifest was read whole), and its
    fields checked: ``preset`` and ``config_hash`` plain words, ``sha256`` and every ``files``
    digest 64 hex digits (a ``"sha256": 12345`` was a 111-line traceback)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"larger than {MAX_MANIFEST_BYTES // 1024} KiB")
        manifest = json.loads(data)
    except (OSError, ValueError, RecursionError) as err:
        raise UserError(f"{path}: not a readable manifest ({printable(' '.join(str(err).split())[:160])}); "
                        "reinstall tracerl") from None
    if not isinstance(manifest, dict) or not all(k in manifest for k in ("preset", "config_hash", "sha256")):
        raise UserError(f"{path}: manifest lacks preset, config_hash or sha256; reinstall tracerl")
    for key in ("preset", "config_hash"):
        if not isinstance(manifest[key], str) or not _WORD.fullmatch(manifest[key]):
            raise UserError(f"{path}: {key} must be a plain word, got {_shown(manifest[key])}; reinstall tracerl")
    files = manifest.get("files", {})
    digests = [("sha256", manifest["sha256"])]
    if isinstance(files, dict):
        digests += [(f"files.{_shown(name)}", digest) for name, digest in files.items()]
    for key, digest in digests:
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise UserError(f"{path}: {key} must be 64 hex digits, got {_shown(digest)}; reinstall tracerl")
    if not isinstance(files, dict) or set(files) != set(FOLDER_FILES):
        raise UserError(f"{path}: files must give the sha256 of each of {', '.join(FOLDER_FILES)}; reinstall tracerl")
    return manifest


def _shown(value: Any) -> str:
    """A manifest value in a message: printable (no ESC or BEL reaches the terminal), cut short."""
    text = repr(value)
    return printable(text if len(text) <= 60 else text[:60] + "...")


def folder_problem(folder: Path, manifest: dict[str, Any]) -> str | None:
    """Why ``folder`` is not exactly what ``manifest`` pins, or None: each of :data:`FOLDER_FILES`
    a regular file (not a symlink: it could point anywhere, and change later) whose sha256 is the
    manifest's, and no other file beside them (transformers would read another weights file)."""
    for name in FOLDER_FILES:
        path = folder / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            return f"{path}: a shipped file must be a regular file, not a link or a folder"
        if not path.is_file():
            return f"{path}: shipped file missing"
        actual = file_sha256(path)
        if actual != manifest["files"][name]:
            return f"{path}: sha256 {actual[:12]}... does not match its manifest ({manifest['files'][name][:12]}...)"
    extra = sorted(p.name for p in folder.iterdir() if p.name not in (*FOLDER_FILES, MANIFEST))
    if extra:
        return f"{folder / extra[0]}: not a file of the shipped model (its manifest lists {len(FOLDER_FILES)} files)"
    return None


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
        problem = folder_problem(folder, manifest)
        if problem is not None:
            raise UserError(f"{problem}; {_refresh_hint(manifest['preset'])}")
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
    else:
        problem = folder_problem(folder, manifest)
        if problem is not None:
            problems.append(f"{problem}; {_refresh_hint(preset)}")
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


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of each of :data:`FOLDER_FILES` in ``folder`` (the manifest's ``files``)."""
    return {name: file_sha256(folder / name) for name in FOLDER_FILES}


def _manifest(preset: str, config: TinyModelConfig, folder: Path, command: str) -> dict[str, Any]:
    log = json.loads((folder / "pretrain_log.json").read_text())
    weights = folder / WEIGHTS_FILE
    return {
        "preset": preset,
        "config_hash": config.hash(),
        "weights_file": WEIGHTS_FILE,
        "sha256": file_sha256(weights),
        "bytes": weights.stat().st_size,
        "files": file_hashes(folder),
        "precision": log.get("precision"),
        "parameters": log.get("parameters"),
        "vocab_size": log.get("vocab_size"),
        "torch": log.get("torch"),
        "threads": log.get("threads"),
        "device": log.get("device"),
        "pretrain_seconds": log.get("total_seconds"),
        "command": command,
    }
