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
- ``nccl``: names, shapes and dtypes only; the tensors follow by broadcast from the driver
  (rank 0) in a process group of its own with the workers (:func:`sync_group`: made on a store
  the executor hosts, never the default group, so it sits beside an FSDP driver's group). A
  replaced worker gets the weights through the object store, then every worker joins a new
  generation of the group. NCCL on CUDA; the same code runs gloo on the CPU (the tests).

``cuda_ipc`` and ``nccl`` are refused off CUDA at config load; neither has run on a GPU yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
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


def unpack(payload: Any, mode: str, device: str = "cpu", group: Any = None) -> list[Bucket]:
    """The worker's half: buckets from :func:`pack`'s payload (``nccl``: received by broadcast
    from rank 0 of ``group``, in payload order)."""
    if mode == "object_store":
        return payload
    if mode == "cuda_ipc":
        return [[(n, rebuild(*args)) for n, (rebuild, args) in bucket] for bucket in payload]
    if mode == "nccl":
        if group is None:
            raise RuntimeError("weight sync 'nccl': this worker has not joined the weight-sync group")
        out = []
        for bucket in payload:
            received = []
            for name, (shape, dtype) in bucket:
                tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                group.broadcast(tensor, 0).wait()
                received.append((name, tensor))
            out.append(received)
        return out
    raise ValueError(f"unknown weight sync mode {mode!r}")


def broadcast(buckets: list[Bucket], group: Any) -> None:
    """The driver's side of ``nccl``: each tensor from rank 0 of ``group``, in bucket order (the
    workers' :func:`unpack` receives them in the same order)."""
    for bucket in buckets:
        for _, tensor in bucket:
            group.broadcast(tensor.detach().contiguous(), 0).wait()


def sync_store(host: str, port: int, timeout_s: float, *, serve: bool = False) -> Any:
    """The key-value store the weight-sync group is made on: the driver serves it (``serve``,
    ``port`` 0 picks a free one: read ``.port``), the workers connect to ``host:port``."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, None, serve, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def sync_group(store: Any, backend: str, generation: int, rank: int, world: int, timeout_s: float) -> Any:
    """Generation ``generation`` of the weight-sync group: ``world`` members (the driver is rank 0),
    a process-group object of its own (never the default group). Every member calls it; it
    returns once all have. ``backend``: ``nccl`` (CUDA tensors) or ``gloo`` (CPU tensors)."""
    import torch.distributed as dist

    prefix = dist.PrefixStore(f"tracerl-weight-sync/{generation}", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefix, rank, world, timedelta(seconds=timeout_s))
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupNCCL(prefix, rank, world, options)
    raise ValueError(f"unknown weight-sync group backend {backend!r}")
