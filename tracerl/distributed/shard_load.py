"""Each FSDP rank builds the policy on the meta device and reads only its own shard of each weight.

Loading the whole model on every rank before sharding costs every rank the full float32 model
(plus the copy sharding makes), the memory FSDP exists to save. Here a rank instead:

1. builds the model from its ``config.json`` under ``torch.device("meta")`` (no storage at all);
2. shards it (:func:`~tracerl.distributed.fsdp.shard_model`) and allocates only its local shards
   (``to_empty``);
3. reads from the ``*.safetensors`` files only the rows of each weight its shard holds
   (``safe_open(...).get_slice``: the file is memory-mapped, the other rows are never copied);
4. recomputes the non-persistent buffers (rotary frequencies), which no checkpoint holds, with the
   model's own initialiser.

FSDP2 shards every parameter on dim 0 the way ``torch.chunk`` splits it (``Shard(0)``), so rank r's
rows are the r-th chunk of ``chunk(world)``; the local shard's shape is checked against it, so a
change in that rule is an error, never a silently wrong model.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from tracerl.distributed.fsdp import shard_model
from tracerl.errors import UserError

INDEX_FILE = "model.safetensors.index.json"


class ShardLoadError(UserError):
    """A model folder whose weights cannot be loaded shard by shard (one line: the folder and why)."""


def weight_files(folder: Path) -> dict[str, Path]:
    """Weight name -> the ``.safetensors`` file holding it (one file, or a sharded checkpoint's index)."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ShardLoadError(f"{index}: not a safetensors index ({type(err).__name__}: {err})") from None
        return {name: folder / Path(str(file)).name for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ShardLoadError(f"{folder}: no model.safetensors or {INDEX_FILE}; sharded training loads each rank's "
                             "shard from safetensors (re-save the model with save_pretrained(..., "
                             "safe_serialization=True))")
    with safe_open(str(single), "pt") as handle:
        return {name: single for name in handle.keys()}


def shard_rows(length: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of dim 0 that rank ``rank`` of ``world`` holds under ``Shard(0)``: the
    ``rank``-th chunk of ``torch.chunk`` (chunks of ``ceil(length / world)``; trailing ranks may hold none)."""
    size = -(-length // world) if length else 0
    start = min(rank * size, length)
    return start, min(start + size, length)


def _local_shard(param: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """A parameter's local storage and the dim-0 rows of the full weight it holds."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return param.data, 0, param.shape[0] if param.dim() else 0
    placements = tuple(param.placements)
    if placements != (Shard(0),):
        raise ShardLoadError(f"a parameter is placed as {placements}, not Shard(0) on a 1-D mesh")
    mesh = param.device_mesh
    start, stop = shard_rows(param.shape[0], mesh.size(), mesh.get_local_rank())
    return param.to_local(), start, stop


def load_shards(model: Any, folder: Path) -> int:
    """Copy each parameter's rows (and every persistent buffer) from ``folder``'s safetensors into
    ``model``'s allocated local shards. Returns the bytes read. Tied weights load once.

    Each weight opens its file on its own: a memory-mapped page stays in the process's resident
    set while its mapping lives, so one mapping over the whole load would add the rank's share of
    the file to its peak."""
    from safetensors import safe_open

    files = weight_files(folder)
    read = 0
    for name, tensor, sharded in _targets(model):
        source = files.get(name)
        if source is None:
            raise ShardLoadError(f"{folder}: the model's weight {name!r} is in none of its safetensors files")
        local, start, stop = _local_shard(tensor) if sharded else (tensor.data, 0, None)
        with safe_open(str(source), "pt") as handle:
            view = handle.get_slice(name)
            rows = view[start:stop] if sharded and tensor.dim() else view[:]
        if tuple(rows.shape) != tuple(local.shape):
            raise ShardLoadError(f"{source}: {name!r} rows {start}:{stop} have shape {tuple(rows.shape)}, "
                                 f"the local shard {tuple(local.shape)}")
        with torch.no_grad():
            local.copy_(rows.to(dtype=local.dtype))
        read += rows.numel() * rows.element_size()
        del rows
    return read


def _targets(model: Any) -> list[tuple[str, torch.Tensor, bool]]:
    """``(name, tensor, is_parameter)`` of what a checkpoint holds: each parameter once (a tied
    weight under the first name the file has), then the persistent buffers."""
    out: list[tuple[str, torch.Tensor, bool]] = [(n, p, True) for n, p in model.named_parameters()]
    persistent = set(model.state_dict().keys())
    out += [(n, b, False) for n, b in model.named_buffers() if n in persistent]
    return out


def _rebuild_buffers(model: Any) -> None:
    """Recompute the non-persistent buffers (rotary frequencies) that ``to_empty`` left uninitialised,
    with the model's own initialiser on the modules that own them (which hold no parameters)."""
    persistent = set(model.state_dict().keys())
    owners = {name.rsplit(".", 1)[0] for name, _ in model.named_buffers() if name not in persistent}
    for owner in sorted(owners):
        module = model.get_submodule(owner)
        if any(True for _ in module.parameters(recurse=False)) or not callable(getattr(model, "_init_weights", None)):
            raise ShardLoadError(f"cannot rebuild the non-persistent buffers of {owner!r} ({type(module).__name__}) "
                                 "after meta-device loading")
        model._init_weights(module)


def _meta_model(folder: Path) -> Any:
    """``folder``'s causal LM built on the meta device: float32, no storage."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tracerl.models.size_guard import check_model_folder

    check_model_folder(folder)  # 200,000 layers would take minutes even on the meta device
    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def whole_load_reason(folder: Path) -> str | None:
    """Why ``folder`` cannot be read shard by shard, or None when it can: its weights are not
    safetensors, or are stored under other names than the model's (a checkpoint that transformers
    converts while loading it, such as per-expert weights it fuses)."""
    try:
        files = weight_files(folder)
    except ShardLoadError as err:
        return str(err).split(";")[0]
    absent = [name for name, _, _ in _targets(_meta_model(folder)) if name not in files]
    if absent:
        return (f"{folder}: {len(absent)} of the model's weights (e.g. {absent[0]!r}) are stored under other "
                "names (transformers converts them while loading)")
    return None


def build_sharded(folder: Path, mesh: Any, dtype: str, device: str,
                  prepare: Callable[[Any], Any] | None = None, reason: str | None = None) -> Any:
    """This rank's FSDP2 shard of ``folder``'s policy: read shard by shard (:func:`sharded_from_folder`)
    when ``reason`` (:func:`whole_load_reason`) is None, else, said in a warning, loaded whole with
    transformers (which converts the checkpoint) and then sharded."""
    if reason is None:
        return sharded_from_folder(folder, mesh, dtype, device, prepare)
    from tracerl.testbed.loading import load_model

    warnings.warn(f"{reason}: each training rank loads the whole model before sharding it", stacklevel=2)
    model, _ = load_model(str(folder), device=device)
    if prepare is not None:
        model = prepare(model)
    return shard_model(model, mesh, dtype).eval()


def sharded_from_folder(folder: Path, mesh: Any, dtype: str, device: str,
                        prepare: Callable[[Any], Any] | None = None) -> Any:
    """The FSDP2-sharded policy of ``folder`` (a Hugging Face causal LM with safetensors weights),
    never materialised whole on this rank. ``prepare``: applied to the meta model before sharding
    (gradient checkpointing). Float32 master weights, as :func:`~tracerl.testbed.loading.load_model`."""
    weight_files(folder)  # refuse a folder without safetensors before building anything
    model = _meta_model(folder)
    if prepare is not None:
        model = prepare(model)
    shard_model(model, mesh, dtype)
    model.to_empty(device=device)
    if getattr(model.config, "tie_word_embeddings", False) and callable(getattr(model, "tie_weights", None)):
        model.tie_weights()  # to_empty gives each module its own storage
    load_shards(model, Path(folder))
    _rebuild_buffers(model)
    return model.eval()


def local_bytes(model: Any) -> int:
    """Bytes of this rank's storage of ``model``'s parameters and buffers (its shard, not the whole)."""
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        key = local.untyped_storage().data_ptr() if local.numel() else id(local)
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    return total
