"""FSDP2 set-up for training over several processes: the process group, sharding, shares.

* :func:`init_distributed` joins the process group torchrun describes (``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``...), with ``dist.backend`` (``auto``: NCCL on CUDA, gloo on the CPU).
* :func:`shard_model` applies ``fully_shard`` to every decoder layer, then to the root, and
  registers the log-prob forward (:data:`~tracerl.train.update.FSDP_LOGPROBS`) as an FSDP
  forward method: the update calls the decoder and the head itself, and without the registration
  the root's parameters (embeddings, final norm, head) would stay sharded ("mixed torch.Tensor
  and DTensor").
* :func:`scatter_shares` sends each rank its share from the driver (rank 0) with
  torch.distributed's object collectives; :func:`full_state_dict` gathers the sharded weights
  for rank 0's rollout backend and its Hugging Face checkpoint.

Imported only on the distributed path: the default run never imports torch.distributed.
"""

from __future__ import annotations

import datetime
import os
import types
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from tracerl.train.packing import FSDP_PACKED_LOGPROBS, local_packed_logprobs
from tracerl.train.update import FSDP_LOGPROBS, local_token_logprobs

BACKENDS = ("auto", "gloo", "nccl")


def resolve_backend(backend: str, device: str) -> str:
    """``auto`` is NCCL for a CUDA ``device`` and gloo otherwise; an explicit name is kept."""
    if backend not in BACKENDS:
        raise ValueError(f"dist.backend = {backend!r} is not valid; allowed values: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if torch.device(device).type == "cuda" else "gloo"
    return backend


def init_distributed(backend: str, device: str, timeout_s: float, store: Any = None) -> DeviceMesh:
    """Join the process group torchrun set up (once) and return a 1-D mesh over all ranks.

    On CUDA each rank takes the GPU ``LOCAL_RANK`` (one process per GPU). ``store``: the
    rendezvous store already made (:func:`~tracerl.distributed.commands.rendezvous_store`), else
    ``env://`` makes one.
    """
    name = resolve_backend(backend, device)
    kind = "cuda" if name == "nccl" else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            dist.init_process_group(name, timeout=timeout)
        else:  # the same prefix init_process_group gives the store it makes itself
            dist.init_process_group(name, timeout=timeout, store=dist.PrefixStore("default_pg", store),
                                    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    return init_device_mesh(kind, (dist.get_world_size(),))


def decoder_layers(model: Any) -> Sequence[torch.nn.Module]:
    """The decoder's layer list of a Hugging Face causal LM (``get_decoder().layers``)."""
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no get_decoder().layers to shard per layer; "
                         "FSDP training supports Hugging Face decoder-only causal LMs")
    return layers


def mixed_precision(dtype: str) -> MixedPrecisionPolicy:
    """bf16 compute with float32 gradient reduction (``dtype = bfloat16``), else float32 throughout.
    The float32 master weights and AdamW state stay sharded in float32 either way."""
    if dtype == "bfloat16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: Any, mesh: DeviceMesh | None = None, dtype: str = "float32") -> Any:
    """``fully_shard`` each decoder layer, then the root; register the log-prob forward. In place.

    Build the optimiser after this: sharding replaces the parameters with DTensor parameters.
    A frozen reference is sharded the same way (its forwards are collectives too).
    """
    policy = mixed_precision(dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    setattr(model, FSDP_LOGPROBS, types.MethodType(local_token_logprobs, model))
    register_fsdp_forward_method(model, FSDP_LOGPROBS)
    setattr(model, FSDP_PACKED_LOGPROBS, types.MethodType(local_packed_logprobs, model))
    register_fsdp_forward_method(model, FSDP_PACKED_LOGPROBS)
    return model


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Every rank calls it; rank 0 gets the full, unsharded state dict on the CPU (others: {}).

    What rank 0's rollout backend loads after each update, and what ``save_pretrained`` writes
    (it cannot write sharded parameters).
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def scatter_shares(shares: Sequence[Any] | None) -> Any:
    """Rank 0 passes one object per rank (index = rank), the others None; each gets its own.

    torch.distributed's ``scatter_object_list`` pickles the objects (trajectories and advantage
    tensors) through the process group.
    """
    out: list[Any] = [None]
    dist.scatter_object_list(out, list(shares) if dist.get_rank() == 0 else None, src=0)
    return out[0]


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (``broadcast_object_list``)."""
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
