"""Atomic checkpoints: a run killed at any moment loses at most the step in flight.

Layout under ``RUN_DIR``::

    ckpt-000004/          policy/ (HF save_pretrained), trainer.pt, config.yaml
    LATEST                name of the newest complete checkpoint folder

A checkpoint folder is written under a temporary name and renamed when complete; ``LATEST``
is replaced with ``os.replace``. Resuming reads ``LATEST`` only, so a half-written folder is
never seen. Older checkpoints are removed after the pointer moves.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "LATEST"


@dataclass
class RngState:
    """Every random stream a step touches, so ``2 + resume + 2`` equals ``4`` steps exactly."""

    python: Any
    numpy: Any
    torch: torch.Tensor
    sampling: torch.Tensor

    @classmethod
    def capture(cls, sampling: torch.Generator) -> RngState:
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), sampling.get_state())

    def restore(self, sampling: torch.Generator) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        sampling.set_state(self.sampling)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so readers see the old or the new content, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any], config_yaml: str
) -> Path:
    """Write checkpoint ``step`` atomically and point ``LATEST`` at it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{step:06d}"
    final = run_dir / name
    tmp = run_dir / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "policy")
    tokenizer.save_pretrained(tmp / "policy")
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_atomic(run_dir / LATEST, name.encode())
    for old in run_dir.glob("ckpt-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None when the run has none."""
    pointer = run_dir / LATEST
    if not pointer.exists():
        return None
    folder = run_dir / pointer.read_text().strip()
    if not (folder / "trainer.pt").exists():
        raise FileNotFoundError(f"{pointer} names {folder.name}, which is incomplete or missing")
    return folder


def load_trainer_state(folder: Path) -> dict[str, Any]:
    # weights_only=False: the state holds numpy/python RNG tuples written by this library.
    return torch.load(folder / "trainer.pt", weights_only=False)
