"""Rank 0 without a whole copy of the policy: weights streamed from the shards (``rollout.executor=ray``).

With Ray rollout workers rank 0 samples nothing, so it keeps no unsharded policy: after each
update the workers are sent the weights gathered one bucket at a time straight from the FSDP
shards (:class:`ShardStream`, what ``RayExecutor.sync_weights`` iterates), and a checkpoint's
``policy/`` is written the same way, one safetensors file per bucket (:func:`export_policy`).
Each tensor's gather is a collective, so every rank iterates the same buckets in the same order:
rank 0 through the executor or the export (each announced by a command: ``stream``, ``export``),
the others through :func:`drain`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tracerl.models.weights import DEFAULT_BUCKET_BYTES, Bucket, weight_buckets


class ShardStream:
    """The sharded policy's weights as a one-pass stream of buckets (``stream_once``: the executor
    keeps what it sent for a replacement worker instead of iterating twice). Reading it first tells
    the other ranks to join (``stream``), so a sync never waits on ranks that were not told, also
    after a step that trained nothing."""

    stream_once = True

    def __init__(self, model: Any, channel: Any) -> None:
        self.model, self.channel = model, channel

    def buckets(self, bucket_bytes: int, dtype: torch.dtype | None) -> Iterator[Bucket]:
        """Buckets in ``dtype`` (each tensor gathered from its shards as its bucket is built)."""
        self.channel.send("stream")
        return weight_buckets(self.model, bucket_bytes, dtype)


class StreamedPolicy:
    """What a checkpoint's ``policy/`` is written from when rank 0 holds no whole policy: its
    ``save_pretrained`` asks the other ranks to join (``export``), then writes the gathered weights."""

    def __init__(self, model: Any, config: Any, channel: Any) -> None:
        self.model, self.config, self.channel = model, config, channel

    def save_pretrained(self, folder: str | Path) -> None:
        from tracerl.runs.state import NonFiniteTrainingError

        self.channel.send("export")
        bad = export_policy(self.model, self.config, Path(folder))
        if bad is not None:
            raise NonFiniteTrainingError(f"parameter {bad} is not finite; not checkpointing it")


def drain(model: Any) -> int:
    """A rank > 0's half of a stream or an export: take part in every gather; the tensors' count."""
    return sum(len(bucket) for bucket in weight_buckets(model, DEFAULT_BUCKET_BYTES, None))


def export_policy(model: Any, config: Any, folder: Path, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> str | None:
    """Rank 0's half of a ``policy/`` export: the gathered float32 weights as a sharded Hugging Face
    checkpoint (``model-NNNNN.safetensors`` per bucket and ``model.safetensors.index.json``) plus
    ``config.json``. Returns the first non-finite weight's name (the file is complete either way:
    the other ranks gather every tensor whatever rank 0 finds)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total, bad = 0, None
    for index, bucket in enumerate(weight_buckets(model, bucket_bytes, None)):
        name = f"model-{index + 1:05d}.safetensors"
        tensors = {n: t.contiguous().cpu() for n, t in bucket}
        if bad is None:
            bad = next((n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())),
                       None)
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors, bucket
    index_text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
    (folder / "model.safetensors.index.json").write_text(index_text + "\n")
    config.save_pretrained(str(folder))
    return bad
