"""Parquet rows read within the bounds JSONL lines are read within.

Parquet compresses: a 26 KB zstd file held one 800 MB string, and reading it whole
(``read_table().to_pylist()``) peaked at 3.49 GB. Here a file is read only after its metadata
says it fits, and then a batch at a time:

1. the footer's length (the file's last 8 bytes) at most :data:`MAX_FOOTER_BYTES`;
2. each row group's uncompressed size (``total_byte_size``, the sum of its column chunks'
   ``total_uncompressed_size``) at most :data:`MAX_ROW_GROUP_BYTES`, and on average per row at
   most the record bound (``data.max_line_bytes`` for data files, the converter's line bound for
   raw files): a row group over it holds a record over it, refused before any data is read,
   naming the largest column;
3. every string column read *dictionary-encoded*, so a value repeated in many rows is held once,
   and each row's size (the bytes of its strings, 8 per other value) computed from the arrays
   before a Python object is made: a row past the bound is refused naming its index.

Each refusal is one :class:`~tracerl.errors.UserError` line naming the file and the field.
pyarrow is the optional ``datasets`` extra; this module is imported only for a ``.parquet`` file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.envs.bounded import MiB
from tracerl.errors import UserError

MAX_FOOTER_BYTES = 64 * MiB
"""A parquet footer (schema and row-group metadata) is kilobytes; past this it is not read."""
MAX_ROW_GROUP_BYTES = 512 * MiB
"""Largest uncompressed row group read (the bound on a ``.json`` data file read whole); writers
default to far smaller groups (pyarrow: 1M rows, Hugging Face datasets: ~100 MB)."""
BATCH_ROWS = 1024
"""Rows converted to Python objects at a time."""


def parquet_rows(path: Path, max_row_bytes: int, field: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(``file[row]``, record) of each row of ``path``, within the bounds of the module docstring;
    ``field`` names the setting that raises ``max_row_bytes`` (``data.max_line_bytes``)."""
    import pyarrow.parquet as pq  # optional extra: only for a .parquet file

    _check_footer(path)
    try:
        meta = pq.ParquetFile(path).metadata
        for group in range(meta.num_row_groups):
            _check_row_group(path, meta.row_group(group), group, max_row_bytes, field)
        schema = pq.ParquetFile(path).schema
        strings = [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "BYTE_ARRAY"]
        reader = pq.ParquetFile(path, read_dictionary=strings)  # a repeated value is held once, not per row
        index = 0
        for batch in reader.iter_batches(batch_size=BATCH_ROWS):
            sizes = sum((_row_bytes(column) for column in batch.columns), np.zeros(batch.num_rows))
            if batch.num_rows and sizes.max() > max_row_bytes:
                row = int(sizes.argmax())
                raise UserError(_too_big(f"{path}[{index + row}]", int(sizes[row]), max_row_bytes, field))
            for record in batch.to_pylist():
                yield f"{path}[{index}]", record
                index += 1
    except UserError:
        raise
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"{path}: not a readable parquet file ({' '.join(str(exc).split())[:200]})") from None


def _check_footer(path: Path) -> None:
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        if size < 12:
            raise UserError(f"{path}: not a readable parquet file (only {size} bytes)")
        handle.seek(size - 8)
        tail = handle.read(8)
    length = struct.unpack("<I", tail[:4])[0]
    if tail[4:] != b"PAR1":
        raise UserError(f"{path}: not a readable parquet file (no PAR1 magic at its end)")
    if length > MAX_FOOTER_BYTES:
        raise UserError(f"{path}: its parquet footer claims {length / MiB:.0f} MiB of metadata, past "
                        f"{MAX_FOOTER_BYTES // MiB} MiB; not a data file")


def _check_row_group(path: Path, group: Any, number: int, max_row_bytes: int, field: str) -> None:
    """Refuse a row group past :data:`MAX_ROW_GROUP_BYTES`, or whose rows average past ``max_row_bytes``."""
    total, rows = group.total_byte_size, max(group.num_rows, 1)
    chunks = [(group.column(i).path_in_schema, group.column(i).total_uncompressed_size) for i in range(group.num_columns)]
    column, largest = max(chunks, key=lambda c: c[1], default=("?", 0))
    if total / rows > max_row_bytes:
        raise UserError(_too_big(f"{path}: row group {number} (column {column!r})", total // rows, max_row_bytes, field,
                                 "its rows average"))
    if total > MAX_ROW_GROUP_BYTES:
        raise UserError(f"{path}: row group {number} holds {total / MiB:.0f} MiB uncompressed (column {column!r}: "
                        f"{largest / MiB:.0f} MiB), past {MAX_ROW_GROUP_BYTES // MiB} MiB; rewrite it with smaller "
                        "row groups or as .jsonl")


def _too_big(where: str, size: int, bound: int, field: str, what: str = "record of") -> str:
    hint = f" (raise {field} if it is meant to be that long)" if field else ""
    return f"{where}: {what} {_bytes(size)}, past the {_bytes(bound)} bound on a record{hint}"


def _bytes(n: int) -> str:
    return f"{n / MiB:.1f}".removesuffix(".0") + " MiB" if n >= MiB else f"{n:,} bytes"


def _row_bytes(array: Any) -> np.ndarray:
    """Bytes of each top-level row of ``array`` (a pyarrow array or chunked array)."""
    import pyarrow as pa

    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    return np.concatenate([_sizes(c, np.arange(len(c)), len(c)) for c in chunks]) if chunks else np.zeros(0)


def _sizes(array: Any, rows: np.ndarray, n: int) -> np.ndarray:
    """Per top-level row (``rows[i]``: the row of element ``i``), the bytes under ``array``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_dictionary(kind):
        lengths = pc.fill_null(pc.take(_lengths(array.dictionary), array.indices), 0)
        return np.bincount(rows, weights=lengths.to_numpy(zero_copy_only=False), minlength=n)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return _sizes(array.flatten(), rows[parents], n)
    if pa.types.is_struct(kind):
        return sum((_sizes(child, rows, n) for child in array.flatten()), np.zeros(n))
    if pa.types.is_map(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return _sizes(array.keys, rows[parents], n) + _sizes(array.items, rows[parents], n)
    weights = _lengths(array).to_numpy(zero_copy_only=False)
    return np.bincount(rows, weights=weights, minlength=n)


def _lengths(array: Any) -> Any:
    """Bytes of each value: a string's or binary's length, 8 for anything else (nulls 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_large_binary(kind):
        return pc.fill_null(pc.binary_length(array), 0)
    return pa.array(np.where(array.is_valid().to_numpy(zero_copy_only=False), 8, 0))
