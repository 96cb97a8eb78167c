"""User errors, and the one line the command line prints for a failure the user can fix.

Rule: a failure the user caused (a bad value, a bad or corrupt file, a missing path, a full
disk) ends in ONE line on stderr naming the file, field or value and what to do; anything
else is a bug and keeps its traceback. :func:`one_line` makes that decision for the CLI.
"""

from __future__ import annotations

import errno
import os
import traceback
from pathlib import Path

MAX_MESSAGE = 400
"""Characters kept of a foreign message (library errors can be paragraphs)."""

# Exception classes that file readers raise for damaged files (torch.load, safetensors, zip).
_CORRUPT_TYPES = ("SafetensorError", "UnpicklingError", "EOFError", "BadZipFile", "HeaderTooLarge")
_CORRUPT_TEXT = ("PytorchStreamReader failed", "failed finding central directory")
_FULL_TEXT = ("No space left on device", "StorageFull", "os error 28", "Disk quota exceeded")
_WRITE_TEXT = ("PytorchStreamWriter failed", "file write failed", "unexpected pos")
# Locals through which readers hold the file they read (innermost frame first).
_PATH_LOCALS = ("filename", "path", "f", "file", "checkpoint_file", "resolved_archive_file", "self")


class UserError(ValueError):
    """A failure the user can fix; the message names the file, field or value and what to do.

    A ``ValueError`` so code that already catches ``ValueError`` for bad input keeps working.
    """


class UsageError(UserError):
    """The command line was used wrongly (exit code 2, like click's own usage errors)."""


def exit_code(exc: BaseException) -> int:
    """2 for usage errors, 1 for every other failure."""
    return 2 if isinstance(exc, UsageError) else 1


def one_line(exc: BaseException, *, writing: str | Path | None = None) -> str | None:
    """The one-line message for a user-caused failure, or None when ``exc`` is a bug.

    ``writing``: the folder the command writes to, named when a full disk or a failed write
    does not say which file it was writing.
    """
    if isinstance(exc, OSError):
        return _os_error(exc, writing)
    if isinstance(exc, UserError):
        return _flat(str(exc))
    text = str(exc)
    if any(t in text for t in _FULL_TEXT):  # a library's writer (safetensors, torch) hit a full disk
        return f"no space left on device writing {writing or 'a file'}; free some space ({type(exc).__name__}: {_flat(text)})"
    if type(exc).__name__ in _CORRUPT_TYPES or any(t in text for t in _CORRUPT_TEXT):
        where = file_in_traceback(exc) or "a file it reads"
        return _flat(f"{where} is corrupt or truncated ({type(exc).__name__}: {text}); "
                     "restore or delete it (an older checkpoint, or a fresh copy of the model)")
    if isinstance(exc, UnicodeDecodeError):  # a text file read whole (file:line comes from our own readers)
        where = file_in_traceback(exc) or "a text file"
        return f"{where} is not valid UTF-8 ({exc.reason} at byte {exc.start}); restore it or save it as UTF-8"
    if isinstance(exc, RuntimeError) and any(t in text for t in _WRITE_TEXT):
        return _flat(f"could not write under {writing or 'the output folder'} (is the disk full?): {text}")
    if isinstance(exc, ValueError):  # Python's convention for a bad value; kept one line as before
        return _flat(text)
    return None


def _os_error(exc: OSError, writing: str | Path | None) -> str:
    target = exc.filename or writing
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return f"{what} writing {target or 'a file'}; free some space (a run resumes from its last checkpoint)"
    if exc.strerror and exc.filename:
        return _flat(f"{exc.strerror}: {exc.filename}")
    return _flat(str(exc) or type(exc).__name__)


def _flat(text: str) -> str:
    """One line: newlines folded to spaces, long foreign messages cut."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def file_in_traceback(exc: BaseException) -> str | None:
    """The existing file a reader was working on when it raised (innermost frame first), if any.

    A fallback for library errors that do not name their file (safetensors, torch.load,
    ``Path.read_text``, whose path is its ``self``).
    """
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        for name in _PATH_LOCALS:
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
                return str(value)
    return None
