"""What a benchmark's JSON records about its base model and the machine it ran on.

A testbed figure is conditional on the base model (one pretraining draw) and, for timings, on the
machine. :func:`provenance` returns both as plain JSON-ready dicts, so a result can be matched to
the exact shipped weights (sha256 from the manifest) and its hardware, and :func:`git_state` records
the commit of the code that made it (issue 48).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from tracerl.testbed.shipped import file_sha256, find_shipped, read_manifest
from tracerl.testbed.tiny_config import get_preset

__all__ = ["base_model_record", "git_state", "machine_facts", "provenance"]

CHECKOUT = Path(__file__).resolve().parents[2]
"""Where the code runs from: the repository root in a checkout (an editable install), else site-packages."""
RESULTS_PATHS = ("benchmarks/results",)
"""Outputs, not code: files changed here do not make the tree dirty (a sweep writes its shards there)."""


def machine_facts() -> dict[str, Any]:
    """torch and transformers versions, CPU model, cores and torch threads, platform, Python, and the
    GPU if any. A trained figure depends on all of them through float rounding."""
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "gpu": gpu,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's answer below
    return platform.processor() or platform.machine()


def base_model_record(name_or_path: str = "tiny", tiny_preset: str = "default") -> dict[str, Any]:
    """Which base model a run starts from: for ``tiny``, the preset, its config hash and the shipped
    weights' sha256 (``source`` ``shipped``; ``cache`` when no shipped copy matches the preset, its
    sha256 then read from the cached folder, ``None`` before it is pretrained); for a model folder,
    the sha256 of its ``model.safetensors`` when it has one; for anything else just the name.
    """
    if name_or_path == "tiny":
        config = get_preset(tiny_preset)
        record: dict[str, Any] = {"name_or_path": "tiny", "tiny_preset": tiny_preset, "config_hash": config.hash()}
        folder = find_shipped(config)
        if folder is not None:
            manifest = read_manifest(folder) or {}
            return {**record, "source": "shipped", "sha256": manifest.get("sha256"), "command": manifest.get("command")}
        from tracerl.testbed.tiny import default_cache_dir  # the cache only matters without a shipped copy

        weights = default_cache_dir() / config.hash() / "model.safetensors"
        return {**record, "source": "cache", "sha256": file_sha256(weights) if weights.is_file() else None}
    weights = Path(name_or_path) / "model.safetensors"
    if not Path(name_or_path).is_dir():  # a hub name or a description ("random Qwen3 ..."): nothing to hash
        return {"name_or_path": name_or_path, "source": "name", "sha256": None}
    return {"name_or_path": name_or_path, "source": "path",
            "sha256": file_sha256(weights) if weights.is_file() else None}


def git_state(root: Path = CHECKOUT, outputs: tuple[str, ...] = RESULTS_PATHS) -> dict[str, Any]:
    """``{"commit", "dirty", "changed", "note"}`` of the git checkout at ``root``: the commit checked out,
    whether any file outside ``outputs`` differs from it (modified, staged, deleted or untracked and
    not ignored) and how many do. ``commit`` and ``dirty`` are ``None`` with a ``note`` saying why when
    git is missing or ``root`` is not the top of a checkout (an installed package: its commit is unknown)."""
    def git(*argv: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # GIT_DIR etc. would point elsewhere
        done = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, env=env, timeout=60,
                              check=True)
        return done.stdout

    try:
        top = git("rev-parse", "--show-toplevel").strip()
        if Path(top).resolve() != Path(root).resolve():  # a package installed inside someone else's checkout
            return {"commit": None, "dirty": None, "changed": None, "note": f"{root} is not a git checkout's top"}
        commit = git("rev-parse", "--verify", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=all", "--", ".",
                     *(f":(exclude){path}" for path in outputs))
    except FileNotFoundError:
        return {"commit": None, "dirty": None, "changed": None, "note": "git not found"}
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        reason = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()
        return {"commit": None, "dirty": None, "changed": None,
                "note": f"{root} is not a git checkout with a commit ({reason[0] if reason else exc!r})"}
    changed = [line for line in status.splitlines() if line.strip()]
    return {"commit": commit, "dirty": bool(changed), "changed": len(changed), "note": None}


def provenance(name_or_path: str | None = "tiny", tiny_preset: str = "default") -> dict[str, Any]:
    """``{"base_model": base_model_record(...), "machine": machine_facts(), "git": git_state()}`` for a
    results JSON; ``name_or_path=None`` for a benchmark without a pretrained base model (``base_model``
    is ``None``)."""
    base = None if name_or_path is None else base_model_record(name_or_path, tiny_preset)
    return {"base_model": base, "machine": machine_facts(), "git": git_state()}
