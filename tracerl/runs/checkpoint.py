"""Atomic, safe-to-load checkpoints: a run killed at any moment loses at most the step in flight.

Layout under ``RUN_DIR``::

    ckpt-000004/          policy/ (HF save_pretrained), trainer.pt, config.yaml
                          (+ dcp/: model and optimiser shards when dist.nproc > 1; runs/sharded.py)
    LATEST                name of the newest complete checkpoint folder

A checkpoint folder is written under a temporary name and renamed when complete; ``LATEST``
is replaced with ``os.replace``. Resuming reads ``LATEST`` only, so a half-written folder is
never seen. Only after the pointer moves are checkpoints beyond the newest ``keep_last``
removed, so a kill during pruning leaves extra old folders, never a missing current one.

Loading never runs code from the run folder: ``trainer.pt`` holds tensors and plain data only
and is read with ``torch.load(weights_only=True)``; ``LATEST`` must name a ``ckpt-NNNNNN``
folder directly inside the run folder. A corrupted file is a :class:`CheckpointError`
(a ``ValueError``) naming it.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from tracerl.envs.bounded import printable
from tracerl.atomic import make_temp_dir, publish_dir
from tracerl.runs.folder import CHECKPOINT_FOLDER, fsync_dir, write_atomic

LATEST = "LATEST"
CHECKPOINT_NAME = CHECKPOINT_FOLDER  # ASCII digits only: ``LATEST`` naming ``ckpt-٠٠٠٠٠١`` is refused
_POINTER_BYTES = 64

__all__ = ["LATEST", "CheckpointError", "RngState", "first_nonfinite", "latest_checkpoint", "prune_checkpoints",
           "load_policy_into", "load_trainer_state", "save_checkpoint", "write_atomic"]


class CheckpointError(ValueError):
    """A checkpoint file or pointer is missing, corrupted, unsafe or names something outside the run
    (control characters of quoted foreign text escaped)."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


@dataclass
class RngState:
    """Every random stream a step touches, so ``2 + resume + 2`` equals ``4`` steps exactly.

    Stored as plain data (:meth:`to_dict`) so ``trainer.pt`` loads with ``weights_only=True``:
    python's Mersenne state (version, 625 ints, gauss), numpy's MT19937 state (key as an
    int64 tensor of shape ``(624,)``, pos, has_gauss, cached gauss), torch's byte states.
    """

    python: tuple
    numpy: dict[str, Any]
    torch: torch.Tensor
    sampling: torch.Tensor
    cuda: list[torch.Tensor] | None = None
    """Per-GPU default generator states when CUDA was initialised (dropout, CUDA-side sampling)."""

    @classmethod
    def capture(cls, sampling: torch.Generator) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(random.getstate(), np.random.get_state(legacy=False), torch.get_rng_state(), sampling.get_state(),
                   cuda)

    def restore(self, sampling: torch.Generator) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        sampling.set_state(self.sampling)
        if self.cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.cuda[: torch.cuda.device_count()])

    def to_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.python
        state = self.numpy["state"]
        return {
            "python": {"version": int(version), "state": [int(x) for x in internal], "gauss": gauss},
            "numpy": {"bit_generator": str(self.numpy["bit_generator"]),
                      "key": torch.from_numpy(np.asarray(state["key"], dtype=np.int64)),
                      "pos": int(state["pos"]), "has_gauss": int(self.numpy["has_gauss"]),
                      "gauss": float(self.numpy["gauss"])},
            "torch": self.torch.clone(),
            "sampling": self.sampling.clone(),
            "cuda": [t.clone() for t in self.cuda] if self.cuda is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RngState:
        py, npy = data["python"], data["numpy"]
        numpy_state = {"bit_generator": npy["bit_generator"],
                       "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
                       "has_gauss": npy["has_gauss"], "gauss": npy["gauss"]}
        return cls((py["version"], tuple(py["state"]), py["gauss"]), numpy_state, data["torch"], data["sampling"],
                   data.get("cuda"))


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """Name of the first tensor holding a NaN or an infinity, or None when all are finite."""
    for name, tensor in named:
        if not bool(torch.isfinite(tensor.detach()).all()):
            return name
    return None


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any], config_yaml: str,
    keep_last: int = 1, write_sharded: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically, point ``LATEST`` at it, then keep the newest ``keep_last``.

    ``trainer_state`` must be tensors and plain data (it is loaded with ``weights_only=True``).
    A folder of the same name that ``LATEST`` does not name (left by a kill between the
    rename and the pointer update) is replaced.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:06d}"
    final = run_dir / name
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (the current checkpoint is always kept), got {keep_last}")
    if (run_dir / LATEST).exists() and _read_pointer(run_dir) == name:
        raise CheckpointError(f"{final} is the current checkpoint; a step is checkpointed once")
    tmp = make_temp_dir(final)  # exclusively, with tracerl's marker: never a planted folder
    try:
        _write_checkpoint_files(tmp, model, tokenizer, trainer_state, config_yaml, write_sharded)
        shutil.rmtree(final, ignore_errors=True)  # an unpointed ckpt-NNNNNN of a killed run (ours by name)
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: our own temporary goes, the run stays as it was
        raise
    write_atomic(run_dir / LATEST, name.encode())
    prune_checkpoints(run_dir, name, keep_last)
    return final


def _write_checkpoint_files(tmp: Path, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
                            config_yaml: str, write_sharded: Callable[[Path], None] | None) -> None:
    model.save_pretrained(tmp / "policy")
    tokenizer.save_pretrained(tmp / "policy")
    with open(tmp / "trainer.pt", "wb") as handle:
        torch.save(trainer_state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    (tmp / "config.yaml").write_text(config_yaml)
    if write_sharded is not None:  # sharded training: every rank writes its shards (DCP) into the same folder
        write_sharded(tmp / "dcp")
    fsync_tree(tmp)


def prune_checkpoints(run_dir: Path, current: str, keep_last: int) -> list[str]:
    """Remove ``ckpt-*`` folders except ``current`` and the newest others up to ``keep_last`` in all.

    Checkpoints of later steps than ``current`` (left by a run resumed from an older one) are
    never kept: they belong to a history that was abandoned. Returns the names removed.
    """
    older = sorted((p for p in run_dir.glob("ckpt-*") if CHECKPOINT_NAME.fullmatch(p.name)
                    and p.is_dir() and p.name != current), key=lambda p: p.name)
    before = [p.name for p in older if p.name < current]  # ascending: the newest are last
    keep = set(before[max(0, len(before) - (keep_last - 1)):]) if keep_last > 1 else set()  # max: not from the end
    removed = []
    for old in older:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old.name)
    return removed


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` (HF writers do not), so the rename publishes durable data."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        fsync_dir(sub)


def _read_pointer(run_dir: Path) -> str:
    pointer = run_dir / LATEST
    if pointer.is_symlink() or not pointer.is_file():
        raise CheckpointError(f"{pointer} is not a plain file (a link, a folder or a device); "
                              f"it must be a file naming a ckpt-NNNNNN folder inside {run_dir}")
    with open(pointer, "rb") as handle:
        raw = handle.read(_POINTER_BYTES + 1)  # bounded: the pointer is 11 bytes
    # Never echo what the file holds: it may be someone else's file's content.
    name = raw.decode("utf-8", errors="replace").strip()
    if len(raw) > _POINTER_BYTES or not CHECKPOINT_NAME.fullmatch(name):
        raise CheckpointError(f"{pointer} does not hold a checkpoint name; it must name a ckpt-NNNNNN "
                              f"folder inside {run_dir}")
    return name


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None when the run has none.

    Raises :class:`CheckpointError` when ``LATEST`` is not a ``ckpt-NNNNNN`` name, names a
    folder outside ``run_dir`` (a symlink) or an incomplete or missing one.
    """
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir / LATEST):  # a dangling link is refused, not "no checkpoint"
        return None
    folder = run_dir / _read_pointer(run_dir)
    if folder.is_symlink() or (folder.exists() and folder.resolve().parent != run_dir.resolve()):
        raise CheckpointError(f"{run_dir / LATEST} names {folder.name}, which points outside {run_dir}")
    if not (folder / "trainer.pt").is_file():
        raise CheckpointError(f"{run_dir / LATEST} names {folder.name}, which is incomplete or missing")
    return folder


def load_trainer_state(folder: Path) -> dict[str, Any]:
    """Read ``trainer.pt`` with ``weights_only=True``: a pickled object that would run code is refused."""
    path = Path(folder) / "trainer.pt"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} holds objects other than tensors and plain data, refused to load "
                              f"({first[:120]}); only load run folders you trust") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is corrupted or truncated ({type(err).__name__}); "
                              "restore it or start a new run") from None
    check_trainer_state(state, path)  # the types of what is there; a resume also requires every field
    return state


_STATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "step": int, "cursor": int, "totals": dict, "optimizer": (dict, type(None)), "scheduler": dict,
    "predictor": (dict, type(None)), "rng": dict, "nonfinite": dict, "scaler": (dict, type(None)),
    "tool_health": dict, "eval_trees_started": int, "divergence": dict,
}
"""``trainer.pt``'s fields and their types."""
RESUME_FIELDS = ("step", "cursor", "totals", "optimizer", "scheduler", "predictor", "rng")
"""The fields a resume reads without a default (older checkpoints lack the others)."""


def check_trainer_state(state: Any, path: Path, require: tuple[str, ...] = ()) -> None:
    """Raise :class:`CheckpointError` naming ``path`` and the field when a safely loaded ``trainer.pt``
    is not the plain data :func:`save_checkpoint` writes (``{}``, a list, a step as text, a short
    random state): restoring it would fail deep in torch or numpy. ``require``: fields that must
    be there (:data:`RESUME_FIELDS` for a resume)."""
    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"{path}: field {field!r} {why}; the checkpoint is damaged or not tracerl's: "
                               "restore it or start a new run")

    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a trainer state; the checkpoint is "
                              "damaged or not tracerl's: restore it or start a new run")
    for name, kind in _STATE_FIELDS.items():
        if name not in state:
            if name in require:
                raise bad(name, "is missing")
            continue
        value = state[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(name, f"is a {type(value).__name__}")
        if isinstance(value, int) and value < 0:
            raise bad(name, "is negative")
    for name in ("totals", "nonfinite", "tool_health"):
        counts = state.get(name, {})
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in counts.items()):
            raise bad(name, "must map names to integers")
    if "rng" in state:
        _check_rng(state["rng"], bad)


def _check_rng(rng: dict[str, Any], bad: Callable[[str, str], CheckpointError]) -> None:
    """The random states have the sizes the generators take (a 3-byte torch state fails in C++)."""
    py, npy = rng.get("python"), rng.get("numpy")
    if not (isinstance(py, dict) and isinstance(py.get("version"), int) and isinstance(py.get("state"), list)
            and len(py["state"]) == 625 and all(isinstance(x, int) for x in py["state"])
            and (py.get("gauss") is None or isinstance(py.get("gauss"), float))):
        raise bad("rng.python", "is not a Python random state (version, 625 integers, gauss)")
    key = npy.get("key") if isinstance(npy, dict) else None
    if not (isinstance(npy, dict) and npy.get("bit_generator") == "MT19937" and isinstance(key, torch.Tensor)
            and tuple(key.shape) == (624,) and isinstance(npy.get("pos"), int) and 0 <= npy["pos"] <= 624
            and isinstance(npy.get("has_gauss"), int) and isinstance(npy.get("gauss"), float)):
        raise bad("rng.numpy", "is not a numpy MT19937 state (key of 624, pos, has_gauss, gauss)")
    size = torch.get_rng_state().numel()
    for name in ("torch", "sampling"):
        value = rng.get(name)
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
                and (value.numel() == size or (name == "sampling" and value.numel() == 16))):
            raise bad(f"rng.{name}", f"is not a torch generator state ({size} bytes)")
    cuda = rng.get("cuda")
    if cuda is not None and not (isinstance(cuda, list) and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                                                                for t in cuda)):
        raise bad("rng.cuda", "is not a list of CUDA generator states")


def model_load_error(err: Exception, folder: str | Path, consequence: str) -> Exception:
    """The one-line :class:`CheckpointError` for a model folder that does not load (a ``config.json``
    that does not match its weights, a tokenizer file that does not parse): transformers raises
    ``RuntimeError``, its config validation its own class, naming neither file nor fix. Out of
    memory is returned as it is (not damage: the machine is too small)."""
    if isinstance(err, MemoryError) or type(err).__name__ in ("OutOfMemoryError", "ModelSizeError"):
        return err  # ModelSizeError (models/size_guard.py) already names the file and the field
    why = " ".join(str(err).replace("For details look at the above report!", "").split())[:200] or type(err).__name__
    return CheckpointError(f"{folder} does not load as a model ({type(err).__name__}: {why}); it is damaged or its "
                           f"config.json does not match its weights: {consequence}")


UNSEEN_TEXT = "tracerl probe: zqxjv \u2603 \u0416\u4e2d 12345"
"""Text no small vocabulary holds whole: a tokenizer must still encode it (through its unknown token)."""


def check_tokenizer(tokenizer: Any, folder: str | Path) -> None:
    """Raise :class:`CheckpointError` when a loaded tokenizer cannot encode unseen text (a word-level
    ``tokenizer.json`` whose unknown token was removed fails only at the first unseen word, deep in a
    rollout)."""
    try:
        tokenizer.encode(UNSEEN_TEXT, add_special_tokens=False)
    except Exception as err:  # noqa: BLE001 - the Rust tokenizer raises a bare Exception
        why = " ".join(str(err).split())[:160] or type(err).__name__
        raise CheckpointError(f"{folder}: the tokenizer cannot encode text outside its vocabulary ({why}); "
                              "its tokenizer.json is damaged: restore it") from None


def load_policy_into(model: Any, folder: Path) -> None:
    """Load the policy of checkpoint ``folder`` (``policy/``: full weights, or a LoRA adapter) into
    ``model`` in place, on its device; a damaged or mismatched file is named in the error."""
    from safetensors import SafetensorError

    from tracerl.models.loading import load_policy_state

    try:
        load_policy_state(model, Path(folder) / "policy")
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"{err}; restore it or start a new run") from None
