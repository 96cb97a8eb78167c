"""One run, one folder: the run-folder lock, what counts as run state, atomic writes, temp cleanup.

A run folder belongs to one process at a time. :class:`RunLock` takes an exclusive,
non-blocking ``fcntl.flock`` on ``RUN_DIR/.lock`` and records the holder's pid and host in it,
so a second process fails at once naming the holder. The kernel drops the lock when the
holder dies (even by SIGKILL), so a killed run never leaves a folder locked.

Everything a run writes goes through a temporary name and ``os.replace``; temporaries carry
tracerl's name and marker (:mod:`tracerl.atomic`) so leftovers of dead processes are recognised
and removed, and nothing of the user's ever is.

A run folder may come from someone else (an unpacked archive, a shared disk), so before a run
or an evaluation touches it :func:`check_run_folder` refuses every entry that is a symbolic
link or not a plain file or folder: through a link, appending to ``metrics.jsonl``, pruning
``rollouts/`` or taking ``.lock`` would write or delete files outside the folder.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import re
import shutil
import socket
import stat
import weakref
from pathlib import Path

from tracerl.atomic import fsync_dir, is_own_temp, open_temp, pid_alive, remove_stale_temps, write_atomic
from tracerl.envs.bounded import printable

__all__ = ["LOCK_FILE", "RUN_ENTRIES", "STATE_NAMES", "RunFolderError", "RunLock", "check_run_folder",
           "discard_partial_run", "fsync_dir", "live_holder", "pid_alive", "refuse_if_state",
           "remove_stale_temps", "run_entries", "run_state", "write_atomic"]

LOCK_FILE = ".lock"
STATE_NAMES = ("metrics.jsonl", "initial", "LATEST")
"""Files and folders whose presence means a run already trained (or began to) here; ``ckpt-*`` too."""

RUN_ENTRIES = (LOCK_FILE, "config.yaml", "metrics.jsonl", "initial", "LATEST", "rollouts", "view", "tensorboard")
"""Entries tracerl reads or writes in a run folder (with ``ckpt-NNNNNN`` and temporaries). W&B's
``wandb/`` is not one: wandb writes its own links there and tracerl never reads it."""

CHECKPOINT_FOLDER = re.compile(r"ckpt-[0-9]{6}")
"""A checkpoint folder's name (ASCII digits: ``\\d`` would take Arabic-Indic ones too); a user's
``ckpt-notes`` is not one, so it is never counted as run state nor removed."""


class RunFolderError(ValueError):
    """A run folder is in use, holds another run's state, or is not a run folder (a user error).

    Control characters of a stranger's names or values quoted in the message are escaped."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


def run_state(run_dir: Path) -> list[str]:
    """Names of the run-state entries in ``run_dir`` (sorted): what makes a fresh start unsafe."""
    if not run_dir.is_dir():
        return []
    found = [name for name in STATE_NAMES if os.path.lexists(run_dir / name)]
    found += [p.name for p in run_dir.iterdir() if CHECKPOINT_FOLDER.fullmatch(p.name)]
    return sorted(found)


def run_entries(run_dir: Path) -> list[Path]:
    """The entries of ``run_dir`` that tracerl reads or writes (:data:`RUN_ENTRIES`, ``ckpt-*``,
    tracerl's own temporaries), sorted; anything else in the folder is the user's and left alone."""
    return sorted(p for p in run_dir.iterdir()
                  if p.name in RUN_ENTRIES or CHECKPOINT_FOLDER.fullmatch(p.name) or is_own_temp(p))


def check_run_folder(run_dir: Path) -> None:
    """Raise :class:`RunFolderError` for the first run-folder entry (at any depth) that is a
    symbolic link or not a regular file or folder (a FIFO, a device, a socket).

    The folder itself may be a link (the user named it); nothing tracerl reads or writes inside it
    may be, so every path a run derives from it stays inside it. Walks the run's own entries
    (:func:`run_entries`: tens to a few thousand files) without following links; other files the
    user keeps there (a fresh start may go into a folder that holds other things) are not walked.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for entry in run_entries(run_dir):
        _check_entry(entry)
        if entry.is_dir() and not entry.is_symlink():
            for root, dirs, files in os.walk(entry, followlinks=False):
                for name in sorted(dirs + files):
                    _check_entry(Path(root) / name)


def _check_entry(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:  # removed while walked (a live run pruning a checkpoint): nothing to refuse
        return
    if stat.S_ISLNK(mode):
        raise RunFolderError(f"{path} is a symbolic link; a run folder must hold its own files "
                             "(a link could make a run write or delete files outside it): remove the link")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise RunFolderError(f"{path} is not a regular file or folder (a FIFO, device or socket); remove it")


def refuse_if_state(run_dir: Path, *, holding_lock: bool = False) -> None:
    """Raise :class:`RunFolderError` naming what is there when ``run_dir`` already holds a run
    (naming the holder when a live run holds it: its state may be changing under our eyes).
    ``holding_lock``: the caller holds the lock itself (no other process can)."""
    holder = None if holding_lock else live_holder(run_dir)
    if holder is not None:
        raise RunFolderError(f"{run_dir} is in use by another tracerl process ({holder}); wait for it to end "
                             "or choose another --out")
    found = run_state(run_dir)
    if found:
        raise RunFolderError(f"{run_dir} already holds run state ({', '.join(found)}); "
                             f"continue it with --resume {run_dir}, start over with --overwrite, or choose another --out")


def live_holder(run_dir: Path) -> str | None:
    """``pid N on host H`` when a process holds ``run_dir``'s lock now, else None; takes nothing
    (a shared, non-blocking probe of a regular ``.lock``, opened without following links)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.read(fd, 4096) or b"{}")
            except (OSError, ValueError, RecursionError):
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


_HELD_LOCKS: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_locks_in_child() -> None:
    """In a forked child (a chat-template sandbox, a tool worker): close this process's copies of
    the run locks without unlocking them. The child shares each lock's open file description, so
    a copy it kept would hold the folder locked after the parent died (the next ``--resume`` would
    find it "in use"), and an unlock from it would release the parent's lock."""
    for lock in list(_HELD_LOCKS):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=_drop_locks_in_child)


class RunLock:
    """An exclusive lock on a run folder, held until :meth:`release` or the process ends (never
    by a child it forks: :func:`_drop_locks_in_child`).

    The lock file is never deleted: deleting it would let two processes lock two different
    files of the same name.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None
        _HELD_LOCKS.add(self)
        if not self._try_lock():
            # A Trainer of this very process that was dropped but not yet collected may still
            # hold it (a reference cycle): collect once before calling it a conflict.
            if self._holder().get("pid") == os.getpid():
                gc.collect()
            if not self._try_lock():
                raise RunFolderError(self._conflict_message())
        if os.fstat(self._fd).st_nlink > 1:  # type: ignore[arg-type]
            self._fresh_lock_file()
        fd = self._fd
        assert fd is not None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)

    def _try_lock(self) -> bool:
        try:  # O_NOFOLLOW: a .lock that is a link must not truncate the file it points to
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            if os.path.islink(self.path):
                raise RunFolderError(f"{self.path} is a symbolic link; the lock must be a file of the run "
                                     "folder itself: remove the link") from None
            raise err
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunFolderError(f"{self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _fresh_lock_file(self) -> None:
        """Move the lock to a new file of its own when ``.lock`` is a hard link (``st_nlink > 1``).

        Writing the holder's record into a hard-linked ``.lock`` would overwrite the other name's
        file, which may lie outside the run folder. The new file is locked before it replaces
        ``.lock``, and the old one is unlocked only after, so the folder is never unlocked in
        between: a process that opened the old file finds it locked (and gives up), one that
        opens the new name finds that locked too. The other name's file is left as it was.
        """
        tmp, fd = open_temp(self.path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file nobody else has opened: cannot fail
        os.replace(tmp, self.path)
        old, self._fd = self._fd, fd
        assert old is not None
        fcntl.flock(old, fcntl.LOCK_UN)
        os.close(old)
        fsync_dir(self.path.parent)

    def _holder(self) -> dict[str, object]:
        try:
            with open(self.path, "rb") as handle:  # a lock we could open: a regular file, not a link
                holder = json.loads(handle.read(4096) or b"{}")
        except (OSError, ValueError, RecursionError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def _conflict_message(self) -> str:
        holder = self._holder()
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        return (f"{self.path.parent} is in use by another tracerl process ({who}); "
                f"wait for it to end or choose another --out")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock (idempotent); the pid/host record stays until the next holder overwrites it."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the kernel drops the lock with the process anyway
            pass


def discard_partial_run(run_dir: Path) -> None:
    """Remove the state of a run that never reached a checkpoint (metrics, initial/, unpointed ckpt-*).

    Called with the lock held, when a run restarts from step 0 or a fresh start fails while
    being set up; ``config.yaml`` and the lock file stay.
    """
    for name in run_state(run_dir):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    fsync_dir(run_dir)
