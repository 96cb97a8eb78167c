"""A model folder's size checked from its ``config.json`` before anything is allocated.

A stranger's (or a damaged) ``config.json`` decides how much memory loading takes:
``num_hidden_layers: 200000`` in a checkpoint made ``tracerl eval --run`` grow ~55 MB/s until a
``MemoryError`` (about 26 GB), and 20,000 layers still built after two minutes. Every load path
of a model folder (:func:`tracerl.testbed.loading.load_model`, ``HFPolicy.from_pretrained``, the
sharded loader's meta model) calls :func:`check_model_folder` first, which in this order:

1. reads ``config.json`` with a size cap (:data:`MAX_CONFIG_BYTES`) and checks each size field
   (layers, widths, heads, experts, vocabulary, at the top level and in nested sub-configs such as
   ``text_config``) against a stated cap (:data:`CAPS`), so nothing absurd is ever built;
2. builds the model on the ``meta`` device (no storage) and sums its parameters: float32 bytes
   (tracerl keeps float32 master weights) past the memory this machine has available
   (:func:`available_bytes`: ``MemAvailable``, and the cgroup limit when lower) are refused;
3. compares each weight's shape in the ``*.safetensors`` headers with the model's, so a
   ``config.json`` that disagrees with its weights (``vocab_size`` edited) is one line naming the
   field's weight, not transformers' multi-line load report with its colour codes.

Each refusal is one :class:`ModelSizeError` line naming the file and the field. A folder whose
config transformers cannot build (a remote-code model) skips steps 2-3: its own loader names that.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tracerl.errors import UserError

__all__ = ["CAPS", "MAX_CONFIG_BYTES", "ModelSizeError", "available_bytes", "check_model_folder"]

MAX_CONFIG_BYTES = 4 * 2**20
"""A model's ``config.json`` is a few KB (a large ``id2label`` a few hundred); past this it is not one."""
CAPS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), 1024),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "head_dim"), 1 << 17),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "moe_intermediate_size"), 1 << 20),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads"), 1 << 12),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 1 << 12),
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 24,
}
"""Stated caps per size field: far past any released model (Llama 3 405B: 126 layers, width 16,384,
MLP 53,248, 128 heads; the largest vocabularies ~262,144), and small enough that building the
model on the meta device to count it takes well under a second per field."""
_NESTED = 2
"""Levels of sub-configs checked (``text_config``, ``vision_config``, ...)."""


class ModelSizeError(UserError):
    """A model folder whose config asks for more than a stated cap or this machine's memory."""


def check_model_folder(folder: str | Path) -> None:
    """Refuse ``folder`` (a local model folder) in one line when its ``config.json`` is too big,
    names a size past :data:`CAPS`, needs more memory than :func:`available_bytes`, or disagrees with
    its safetensors weights; a name that is not a local folder (a hub id) passes unchanged."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not os.path.lexists(config_file):
        return  # a hub id, or a folder the loader will name as not a model
    config = _read_config(config_file)
    _check_fields(config, config_file, "", _NESTED)
    model = _meta_model(folder)
    if model is None:
        return
    params = sum(p.numel() for p in model.parameters())
    need, have = 4 * params, available_bytes()
    if have is not None and need > have:
        raise ModelSizeError(f"{config_file}: the model it describes has {params:,} parameters, {need / 2**30:.1f} GiB "
                             f"as float32, more than this machine's {have / 2**30:.1f} GiB of available memory; "
                             "check num_hidden_layers, hidden_size, intermediate_size and vocab_size")
    _check_weight_shapes(folder, model, config_file)


def _read_config(path: Path) -> dict[str, Any]:
    try:  # a regular file only: a link to /dev/zero or a FIFO would never end (or block)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ModelSizeError(f"{path} is not a regular file (a device, FIFO or socket); restore the config.json")
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ModelSizeError(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelSizeError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not a model config")
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ModelSizeError(f"{path}: not valid JSON ({' '.join(str(err).split())[:160]})") from None
    if not isinstance(config, dict):
        raise ModelSizeError(f"{path}: holds a JSON {type(config).__name__}, not a model config object")
    return config


def _check_fields(config: dict[str, Any], path: Path, prefix: str, depth: int) -> None:
    """Each size field of :data:`CAPS` a whole number within its cap (``1e9`` written as a float counts)."""
    for key, value in config.items():
        field = f"{prefix}{key}"
        if isinstance(value, dict) and depth > 0:
            _check_fields(value, path, f"{field}.", depth - 1)
        cap = CAPS.get(key)
        if cap is None or value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and value.is_integer():
            whole, value = True, int(value)
        if not whole or value < 0:
            raise ModelSizeError(f"{path}: {field} must be a non-negative whole number, got {_shown(value)}")
        if value > cap:
            raise ModelSizeError(f"{path}: {field} = {value:,} is past tracerl's cap of {cap:,} (no released model "
                                 "comes near it); the file is damaged or not a model's config")


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def _meta_model(folder: Path) -> Any:
    """``folder``'s causal LM on the meta device (no storage), or None when transformers cannot build it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the loader itself reports what is wrong with such a config
    try:
        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception:  # noqa: BLE001 - a config transformers rejects: the real load names it, no allocation happened
        return None
    finally:
        hf_logging.set_verbosity(verbosity)


def _check_weight_shapes(folder: Path, model: Any, config_file: Path) -> None:
    """A weight stored under one of the model's names with another shape: the config disagrees with it."""
    from safetensors import safe_open

    shapes = {name: list(p.shape) for name, p in model.state_dict().items()}
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(shard), "pt") as handle:
                stored = {key: handle.get_slice(key).get_shape() for key in handle.keys()}
        except Exception:  # noqa: BLE001 - a damaged header: the loader names it as corrupt
            return
        for key, shape in stored.items():
            want = shapes.get(key)
            if want is not None and list(shape) != want:
                raise ModelSizeError(f"{config_file} does not match {shard.name}: it makes {key} of shape {want}, the "
                                     f"file holds {list(shape)}; restore the config.json that came with the weights")


def available_bytes() -> int | None:
    """Memory this process can still allocate: ``MemAvailable`` of ``/proc/meminfo``, lowered to the
    cgroup v2 limit's headroom when one is set; None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
