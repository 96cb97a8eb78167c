"""tracerl's own temporaries, atomic writes, and the cleanup of what a killed writer left.

Every file tracerl writes goes to a temporary sibling first and is renamed over its target
(``os.replace``), so a kill or a full disk leaves the old content or the new one, never a torn
file. Cleanup of the temporaries a killed writer left must never touch a file of the user's,
so a temporary is recognised by a name *and* a marker only tracerl writes:

- its name is ``.TARGET.tracerl-tmp-PID-TOKEN``: ``PID`` the writer's (ASCII digits, within the
  platform's pid range), ``TOKEN`` 8 random hex digits followed by 8 hex digits of a keyed
  BLAKE2 hash of ``(TARGET, PID, random part)``, which a name chosen by hand (``.x.tmp-1``,
  ``.backup.tracerl-tmp-1-deadbeef``) does not carry;
- it is created exclusively (``O_EXCL`` for a file, ``mkdir`` for a folder), so a planted entry
  of the same name is never written through nor reused;
- a temporary folder also holds :data:`FOLDER_MARK`, a file whose content is the folder's own
  name, written at creation; a folder without it (a copy, or one made by hand) is never removed.

:func:`remove_stale_temps` removes only entries that pass all of these checks: all of them when
the caller holds the folder's lock (no other writer may exist), else those whose pid is gone.
This module sits below ``envs/`` and ``runs/`` (it imports nothing of tracerl's) so data
conversions, run folders, the viewer and the pretraining cache share one naming.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, NoReturn

FOLDER_MARK = ".tracerl-temp"
"""The marker file inside a temporary folder; its content is the folder's name."""

_TEMP = re.compile(r"^\.(?P<target>.+)\.tracerl-tmp-(?P<pid>[0-9]{1,10})-(?P<rand>[0-9a-f]{8})(?P<tag>[0-9a-f]{8})$")
_KEY = b"tracerl temporary v1"


def _pid_max() -> int:
    """The largest pid this platform hands out (Linux: ``/proc/sys/kernel/pid_max``, at most 2**22)."""
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as handle:
            value = int(handle.read(32).strip() or b"0")
    except (OSError, ValueError):
        value = 0
    return value if 0 < value <= 2**31 - 1 else 2**31 - 1


PID_MAX = _pid_max()


def _tag(target: str, pid: str, rand: str) -> str:
    message = "\0".join((target, pid, rand)).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(message, key=_KEY, digest_size=4).hexdigest()


def _temp_name(target: str) -> str:
    pid, rand = str(os.getpid()), secrets.token_hex(4)
    return f".{target}.tracerl-tmp-{pid}-{rand}{_tag(target, pid, rand)}"


def temp_owner(name: str) -> int | None:
    """The writer's pid when ``name`` is a temporary tracerl names (the keyed tag checked and the pid
    within the platform's range), else None: the entry is not tracerl's and is left alone."""
    match = _TEMP.match(name)
    if match is None or _tag(match["target"], match["pid"], match["rand"]) != match["tag"]:
        return None
    pid = int(match["pid"])
    return pid if 0 < pid <= PID_MAX else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 probes without sending anything).

    A pid outside ``1..PID_MAX`` counts as alive: no process of ours can have it, and ``os.kill``
    would raise ``OverflowError`` (or probe a process group for 0 and negatives)."""
    if not 0 < pid <= PID_MAX:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file inside ``folder`` durable (POSIX: the entry lives in the folder)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_temp(path: Path) -> tuple[Path, int]:
    """Create ``path``'s temporary sibling exclusively; its path and a writable descriptor."""
    path = Path(path)
    while True:
        tmp = path.with_name(_temp_name(path.name))
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:  # 2**32 random names: only a planted entry collides; draw again
            continue


def make_temp_dir(path: Path) -> Path:
    """Create ``path``'s temporary sibling folder exclusively, with its :data:`FOLDER_MARK`.

    Call :func:`publish_dir` to rename it over ``path``."""
    path = Path(path)
    while True:
        tmp = path.with_name(_temp_name(path.name))
        try:
            tmp.mkdir()
            break
        except FileExistsError:
            continue
    fd = os.open(tmp / FOLDER_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, tmp.name.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    return tmp


def publish_dir(tmp: Path, path: Path) -> None:
    """Rename the temporary folder ``tmp`` (from :func:`make_temp_dir`) over ``path`` (which must be
    absent or an empty folder), its marker removed first so the published folder holds only its
    content; durably."""
    (tmp / FOLDER_MARK).unlink(missing_ok=True)
    fsync_dir(tmp)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def _raise_named(err: BaseException, path: Path) -> NoReturn:
    """Re-raise ``err``; an ``OSError`` of ``write()`` (a full disk, a file-size limit) names no file,
    so it is raised again naming ``path`` (the temporary's name would mean nothing to the user)."""
    if isinstance(err, OSError) and err.filename is None and err.errno is not None:
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    raise err


def _replace_with(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write`` on a fresh temporary beside ``path``, fsync it and rename it over ``path``.

    A failure (a full disk) removes the temporary and leaves ``path`` as it was. A hard link
    planted at ``path`` is broken off (the other name keeps its old content), never written through.
    """
    tmp, fd = open_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        _raise_named(err, path)
    fsync_dir(Path(path).parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so readers see the old or the new content, never a torn one, durably."""
    _replace_with(path, lambda handle: handle.write(data))


def write_atomic_lines(path: Path, lines: Iterable[str]) -> None:
    """:func:`write_atomic` for text streamed line by line (UTF-8, each line as given): a JSONL
    output of any length is written whole or not at all, never held in memory twice."""
    def write(handle: BinaryIO) -> None:
        for line in lines:
            handle.write(line.encode("utf-8"))

    _replace_with(path, write)


def _is_marked_dir(entry: Path) -> bool:
    """Whether ``entry`` is a real folder (not a link) holding a regular :data:`FOLDER_MARK` that
    names it: a folder tracerl made with :func:`make_temp_dir`."""
    try:
        fd = os.open(entry / FOLDER_MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, 4096) == entry.name.encode("utf-8", "surrogateescape")
    finally:
        os.close(fd)


def is_own_temp(entry: Path) -> bool:
    """Whether ``entry`` is a temporary tracerl made: its name (:func:`temp_owner`) and, for a
    folder, its marker (a link is never one: only its name would be removed)."""
    if temp_owner(entry.name) is None:
        return False
    try:
        mode = os.lstat(entry).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return _is_marked_dir(entry)
    return stat.S_ISREG(mode)


def remove_stale_temps(folder: Path, *, holding_lock: bool) -> list[str]:
    """Remove the temporaries tracerl's killed writers left in ``folder`` (not below); the names removed.

    Holding the folder's lock means no other process may write there, so every temporary of
    tracerl's is stale; without it only those whose writer's pid is gone are. Anything else
    (a user's ``.x.tmp-1``, a folder without its marker, a link) is left alone.
    """
    removed = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        pid = temp_owner(entry.name)
        if pid is None or (not holding_lock and pid_alive(pid)) or not is_own_temp(entry):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed
