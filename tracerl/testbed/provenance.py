"""What a benchmark's JSON records about its base model and the machine it ran on.

A testbed figure is conditional on the base model (one pretraining draw) and, for timings, on the
machine. :func:`provenance` returns both as plain JSON-ready dicts, so a result can be matched to
the exact shipped weights (sha256 from the manifest) and its hardware.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from tracerl.testbed.shipped import file_sha256, find_shipped, read_manifest
from tracerl.testbed.tiny_config import get_preset

__all__ = ["base_model_record", "machine_facts", "provenance"]


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


def provenance(name_or_path: str | None = "tiny", tiny_preset: str = "default") -> dict[str, Any]:
    """``{"base_model": base_model_record(...), "machine": machine_facts()}`` for a results JSON;
    ``name_or_path=None`` for a benchmark without a pretrained base model (``base_model`` is ``None``)."""
    base = None if name_or_path is None else base_model_record(name_or_path, tiny_preset)
    return {"base_model": base, "machine": machine_facts()}
