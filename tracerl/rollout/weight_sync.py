"""How new weights travel from the trainer to Ray rollout workers (``rollout.weight_sync``).

Every mode moves the same thing, ``(name, tensor)`` buckets in the policy's dtype
(:func:`tracerl.models.weights.weight_buckets`), one bucket at a time (the executor streams them),
and every worker ends with :meth:`LocalExecutor.sync_weights` on buckets. A mode is two halves:
``pack`` on the driver (what goes into the Ray call) and ``unpack`` on the worker (buckets back).

- ``object_store``: the buckets themselves; the driver ``ray.put``\\ s each once and every worker
  reads the same object (CPU tensors, any cluster: one copy per node). The default, and what the
  CPU tests run.
- ``cuda_ipc``: CUDA IPC handles of the driver's tensors (``torch.multiprocessing``'s reduction);
  a worker on the same node maps them without a copy through the host. The driver keeps each
  bucket alive until every worker has loaded it.
- ``nccl``: names, shapes and dtypes only; the tensors follow by ``torch.distributed.broadcast``
  from the driver (rank 0) in a group the executor sets up with its workers.

``cuda_ipc`` and ``nccl`` are refused off CUDA at config load; neither has been run yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Bucket = list[tuple[str, torch.Tensor]]


def bucket_bytes(buckets: Sequence[Bucket]) -> int:
    """Bytes of the tensors in ``buckets`` (``sync_bytes`` in the metrics)."""
    return sum(t.numel() * t.element_size() for bucket in buckets for _, t in bucket)


def pack(buckets: list[Bucket], mode: str) -> Any:
    """The driver's half: what a worker receives for ``buckets`` under ``mode``."""
    if mode == "object_store":
        return [[(n, t.detach().cpu()) for n, t in bucket] for bucket in buckets]
    if mode == "cuda_ipc":
        from torch.multiprocessing.reductions import reduce_tensor

        return [[(n, reduce_tensor(t.detach().contiguous())) for n, t in bucket] for bucket in buckets]
    if mode == "nccl":
        return [[(n, (tuple(t.shape), str(t.dtype).removeprefix("torch."))) for n, t in bucket] for bucket in buckets]
    raise ValueError(f"unknown weight sync mode {mode!r}")


def unpack(payload: Any, mode: str, device: str = "cpu") -> list[Bucket]:
    """The worker's half: buckets from :func:`pack`'s payload (``nccl``: received by broadcast
    from rank 0 of the default process group, in payload order)."""
    if mode == "object_store":
        return payload
    if mode == "cuda_ipc":
        return [[(n, rebuild(*args)) for n, (rebuild, args) in bucket] for bucket in payload]
    if mode == "nccl":
        import torch.distributed as dist

        out = []
        for bucket in payload:
            received = []
            for name, (shape, dtype) in bucket:
                tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                dist.broadcast(tensor, src=0)
                received.append((name, tensor))
            out.append(received)
        return out
    raise ValueError(f"unknown weight sync mode {mode!r}")


def broadcast(buckets: list[Bucket]) -> None:
    """The driver's side of ``nccl``: each tensor from rank 0, in bucket order (the workers'
    :func:`unpack` receives them in the same order)."""
    import torch.distributed as dist

    for bucket in buckets:
        for _, tensor in bucket:
            dist.broadcast(tensor.detach().contiguous(), src=0)
