"""Bounded reads of files that may come from someone else: no read without a size limit.

A line of a JSONL file, a ``LATEST`` pointer, a config file: each has a largest size that is
still plausible, and a file past it (a 50 MB line, a link to ``/dev/zero``) is refused with one
line naming the file (and line) instead of being read into memory. Nested JSON deeper than
Python's recursion limit is a bad record too, not a ``RecursionError`` traceback.

Pure Python; imports only :mod:`tracerl.errors` (training reads its run folders through it too).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tracerl.errors import UserError

MiB = 1 << 20
CHUNK = 1 << 16


class TooLarge(UserError):
    """A file or a line is larger than its limit (the message names it and the limit)."""


def open_regular(path: str | Path) -> IO[bytes]:
    """Open ``path`` for binary reading, refusing anything but a regular file.

    A FIFO, a device (``/dev/zero``) or a socket would make a reader block or never end. The
    file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before anything is read, so a
    FIFO with no writer cannot block the open itself (a plain ``open()`` would), and the check
    is on the object actually opened (no race between a check and the open).
    Symbolic links are followed here (a user may link their own data); run folders refuse
    links separately (:func:`tracerl.runs.folder.check_run_folder`).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{path} is not a regular file (a device, FIFO or socket); give a file")
        os.set_blocking(fd, True)  # no effect on a regular file's reads; restores the usual flags
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | Path, max_bytes: int, what: str = "file") -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` bytes."""
    with open_regular(path) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"{path}: {what} larger than {_size(max_bytes)}; refused to read it")
    return data


def is_regular(path: str | Path) -> bool:
    """Whether ``path`` (links followed) is a regular file; never opens it (a FIFO stays unopened)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def lines_limited(handle: IO[bytes], max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, line bytes)`` of a binary file, ``None`` for a line over ``max_line_bytes``.

    The rest of an over-long line is skipped in chunks, so memory stays at ``max_line_bytes``
    whatever the file holds; the caller decides whether such a line is fatal or skipped.
    """
    lineno = 0
    while True:
        raw = handle.readline(max_line_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = handle.readline(CHUNK)
            yield lineno, None
            continue
        yield lineno, raw


def line_too_long(where: str, max_line_bytes: int, field: str = "") -> str:
    """The message for a line over its limit (``field``: the config field that sets the limit)."""
    hint = f" (raise {field} if it is meant to be that long)" if field else ""
    return f"{where}: line longer than {_size(max_line_bytes)}{hint}"


def loads_json(text: str | bytes) -> Any:
    """``json.loads``, with nesting too deep for the parser as a ``ValueError`` (not a traceback)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7f, 0xa0)] if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """``text`` with terminal control characters escaped (``\\x1b``): a stranger's file named or quoted
    in a message must not retitle, clear or recolour the terminal it is printed on."""
    return text.translate(_CONTROL)


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n} bytes"
