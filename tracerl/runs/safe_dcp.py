"""Reading a sharded (DCP) checkpoint without unpickling what a stranger wrote.

torch.distributed.checkpoint reads a checkpoint's ``.metadata`` with ``pickle.load``
(``FileSystemReader.read_metadata``) and its non-tensor items with ``torch.load(...,
weights_only=False)`` (``DefaultLoadPlanner.load_bytes``): a crafted run folder would run code on
``--resume``. Here the metadata is unpickled by :class:`_MetadataUnpickler`, which builds only
DCP's own metadata records, ``torch.Size``, dtypes, layouts and paths, and the non-tensor items
(optimiser hyper-parameters) go through ``torch.load(..., weights_only=True)``. A legitimate
checkpoint holds nothing else, so this is the only way tracerl reads one. Imported only on the
sharded path (torch.distributed.checkpoint is heavy).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.planner import ReadItem

from tracerl.errors import UserError

ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
}
"""Globals a DCP ``.metadata`` may name besides the classes of ``torch.distributed.checkpoint.metadata``
and torch's dtypes."""


class UnsafeCheckpointError(UserError):
    """A checkpoint's metadata names something a DCP checkpoint never holds (it would run code)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, source: str) -> None:
        super().__init__(stream)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(f"{self.source} names {module}.{name}, which a DCP checkpoint's metadata never "
                                    "holds; it was not loaded (a crafted checkpoint could run code)")


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled by :class:`_MetadataUnpickler`.

    DCP folds a reader's error into a multi-line ``CheckpointException`` and logs each failed
    metadata read with its traceback on the root logger, so the caller reads the metadata first
    (:meth:`read_metadata`, then kept for DCP's own call) and raises :attr:`failure` (one line
    naming the file) before DCP starts."""

    failure: UserError | None = None
    _metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if self._metadata is not None and rank is None:
            self._metadata.storage_meta.load_id = self.load_id  # DCP's reset() draws a new one
            return self._metadata
        path = self._get_metadata_path(rank)
        try:
            with self.fs.create_stream(path, "rb") as stream:
                metadata = _MetadataUnpickler(stream, str(path)).load()
        except UnsafeCheckpointError as err:
            self.failure = self.failure or err
            raise
        except Exception as err:
            if rank is None or Path(path).name == ".metadata":  # DCP also probes per-rank files that may not exist
                self.failure = self.failure or UserError(
                    f"{path} is not readable DCP metadata ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
            raise
        if not isinstance(metadata, Metadata):
            self.failure = UnsafeCheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
            raise self.failure
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        if rank is None:
            self._metadata = metadata
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor items with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpointError(f"item {read_item.dest_index.fqn!r} of the sharded checkpoint is not plain "
                                        f"data ({str(err).splitlines()[0]}); it was not loaded") from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes places it
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
