"""Weights as a stream of ``(name, tensor)`` buckets, for ``sync_weights`` (trainer -> backends).

A backend that does not share the trainer's model (vLLM, a rollout worker in another process)
receives the new weights as buckets of about ``bucket_bytes`` rather than one whole-model
blob: :func:`weight_buckets` reads the trainer's state dict lazily, so only one bucket is
materialised at a time, and a sharded (FSDP2 ``DTensor``) parameter is unsharded
(``full_tensor()``) one at a time as its bucket is built. Buckets hold whole layers: names that
share a layer prefix (``model.layers.3.``) never straddle two buckets, because a serving engine
that fuses a layer's projections (vLLM's ``qkv_proj``) must see all of them in one load. With
``dtype`` (the policy's working precision) each floating tensor is cast as its bucket is built, so
a bf16 policy's float32 master weights travel as 2 bytes per parameter and no whole-model copy
in either precision is ever made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

Bucket = list[tuple[str, torch.Tensor]]
DEFAULT_BUCKET_BYTES = 256 * 2**20
"""About this many bytes per bucket (a layer larger than that is a bucket of its own)."""

_LAYER = re.compile(r"^(.*?\.\d+)\.")


def layer_key(name: str) -> str:
    """The layer a parameter belongs to: its name up to the first numeric part
    (``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``), else its parent module."""
    match = _LAYER.match(name)
    return match.group(1) if match else name.rsplit(".", 1)[0]


def _state(model_or_state: Any) -> Mapping[str, torch.Tensor]:
    return model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state


def _storage(tensor: torch.Tensor) -> int:
    """What tied aliases share: the storage of the tensor (a DTensor: of its local shard). An empty
    local shard (a rank holding no rows of a short tensor) has no storage to share: its own key, so
    every rank keeps the same names and gathers the same tensors in the same order."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.data_ptr() if local.numel() else -id(tensor)


def _full(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor, detached (a DTensor is gathered from its shards); a floating tensor cast
    to ``dtype`` when given (a copy only when the dtype differs)."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    full = full.detach()
    return full.to(dtype) if dtype is not None and full.is_floating_point() else full


def _nbytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    if dtype is not None and tensor.is_floating_point():
        return tensor.numel() * (torch.finfo(dtype).bits // 8)
    return tensor.numel() * tensor.element_size()


def weight_buckets(model_or_state: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   dtype: torch.dtype | None = None) -> Iterator[Bucket]:
    """``(name, tensor)`` buckets of a model's (or state dict's) tensors, in state-dict order.

    Tied aliases go once, under the name that is not ``lm_head.*`` (serving engines skip the head
    of a tied model). Tensors keep their device; their dtype too unless ``dtype`` is given (floating
    tensors are then cast to it, integer buffers kept). Each is unsharded and cast as its bucket is
    built, so one bucket at a time is materialised.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    state = _state(model_or_state)
    kept: dict[int, str] = {}
    for name, tensor in state.items():
        ptr = _storage(tensor)
        if ptr not in kept or kept[ptr].startswith("lm_head."):
            kept[ptr] = name
    names = [n for n in state if kept.get(_storage(state[n])) == n]
    bucket: list[str] = []
    size, last = 0, None
    for name in names:
        nbytes = _nbytes(state[name], dtype)
        key = layer_key(name)
        if bucket and key != last and size + nbytes > bucket_bytes:
            yield [(n, _full(state[n], dtype)) for n in bucket]
            bucket, size = [], 0
        bucket.append(name)
        size, last = size + nbytes, key
    if bucket:
        yield [(n, _full(state[n], dtype)) for n in bucket]


def load_buckets(model: torch.nn.Module, buckets: Iterable[Bucket]) -> int:
    """Copy ``buckets`` into ``model``'s parameters and buffers by name (a tied alias updates both
    names); returns the number of tensors copied. An unknown name is an error naming it."""
    targets = dict(model.state_dict(keep_vars=True))
    copied = 0
    with torch.no_grad():
        for bucket in buckets:
            for name, tensor in bucket:
                if name not in targets:
                    raise ValueError(f"sync_weights: the model has no parameter {name!r}")
                targets[name].data.copy_(tensor)
                copied += 1
    return copied
