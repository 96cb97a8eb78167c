"""Tool calls in worker processes that can be killed: a hung tool cannot stall the run.

A thread cannot be killed, and a tool that hangs while holding the GIL (a catastrophic-backtracking
regex) stops every thread of the trainer, the one waiting for the timeout included. An
*isolated* tool (:attr:`~tracerl.envs.tools.Tool.isolated`: plug-in tools of ``data.tools`` by
default, any tool that opts in) runs in a separate process instead; on timeout that process is
killed (SIGKILL) and a fresh one is started for the next call.

A :class:`WorkerPool` serves every isolated tool of the process: one call per worker at a time,
as many workers as calls in flight (the rollout engine bounds those by
``rollout.engine.tool_concurrency``), idle workers kept for the next calls. Workers come from a
``forkserver`` (``spawn`` where there is none): never a fork of the trainer, which holds torch's
threads, and a replacement starts in milliseconds. An isolated tool must therefore be importable:
a module-level function, pickled by reference.

A worker never outlives the trainer: it asks the kernel for SIGKILL when its parent dies (Linux's
parent-death signal; its parent is the forkserver, which exits when the trainer does), and a
watchdog thread checks the trainer's pid (the only guard where there is no such signal). The
worker ignores SIGINT: the user's Ctrl-C reaches the trainer, which kills the busy workers and
stops. What a tool prints never reaches the trainer's terminal: the worker's stdout and stderr go
to ``/dev/null`` and Python-level prints of a call are kept (first ``MAX_FAILURE_CHARS``) only to
be added to that call's failure message. Results and failure messages are cut to ``max_chars``
in the worker, so a tool returning or raising 10 MB never sends them. Overhead per call: see
``benchmarks/systems/tool_isolation.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import inspect
import io
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from tracerl.envs.tool_errors import MAX_FAILURE_CHARS, ToolFailure, bounded_message

_CONTEXT = multiprocessing.get_context(
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
MAX_WORKERS = 256
"""Worker processes one pool may hold (far above any sensible ``tool_concurrency``)."""
_PR_SET_PDEATHSIG = 1
_WATCHDOG_PERIOD_S = 0.5


class _Capped(io.TextIOBase):
    """A text sink keeping the first ``limit`` characters written and counting the rest."""

    def __init__(self, limit: int = MAX_FAILURE_CHARS) -> None:
        self.limit, self.kept, self.cut = limit, io.StringIO(), 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        room = self.limit - self.kept.tell()
        self.kept.write(text[:max(room, 0)])
        self.cut += max(len(text) - max(room, 0), 0)
        return len(text)

    def text(self) -> str:
        more = f"... [{self.cut} more characters cut]" if self.cut else ""
        return self.kept.getvalue() + more


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): signal 0 only says the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _let_the_forkserver_go() -> None:
    """Close this worker's copy of the forkserver's "alive" pipe (every forkserver child inherits
    it): the forkserver exits when that pipe's last writer closes, and a worker holding it would
    keep the forkserver, hence itself, alive after the trainer died."""
    server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def _die_with(trainer: int) -> None:
    """SIGKILL this worker when its parent dies (Linux), and a watchdog on the trainer's pid; exit
    at once when the trainer is already gone (it died while this worker was being started)."""
    _let_the_forkserver_go()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still guards
    if not _alive(trainer):
        os._exit(0)

    def watch() -> None:  # runs whenever the GIL is free: covers a sleeping or I/O-bound tool
        while _alive(trainer):
            time.sleep(_WATCHDOG_PERIOD_S)
        os._exit(0)

    threading.Thread(target=watch, name="tracerl-trainer-watchdog", daemon=True).start()


def _silence() -> None:
    """Send the worker's stdout and stderr (the trainer's terminal, inherited) to /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def _serve(conn: Connection, trainer: int) -> None:
    """The worker's loop: ``(fn, kwargs, max_chars)`` in, ``(kind, payload)`` out, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    _die_with(trainer)
    _silence()
    while True:
        try:
            fn, kwargs, max_chars = conn.recv()
        except (EOFError, OSError):  # the trainer went away
            return
        except Exception as exc:  # noqa: BLE001 - the tool's module cannot be imported here
            conn.send(("raised", f"{type(exc).__name__} in the worker process: {bounded_message(str(exc))}"))
            continue
        conn.send(_run_captured(fn, kwargs, max_chars))


def _run_captured(fn: Callable[..., Any], kwargs: dict[str, Any], max_chars: int) -> tuple[str, str]:
    """One call with its prints kept in a bounded buffer (added to a failure's message)."""
    printed = _Capped()
    sys.stdout = sys.stderr = printed
    try:
        result = fn(**kwargs)
        if inspect.iscoroutine(result):  # an ``async def`` tool: awaited here, in the worker
            result = asyncio.run(result)
        return ("ok", result[:max_chars]) if isinstance(result, str) else ("type", type(result).__name__)
    except SystemExit as exc:
        return ("exit", repr(exc.code))
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt here is the tool's own, not the user's
        said = printed.text().strip()
        tail = f" (it printed: {bounded_message(said, 300)})" if said else ""
        return ("raised", f"{type(exc).__name__}: {bounded_message(str(exc))}{tail}")
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


class IsolatedWorker:
    """A killable worker process for tool calls; replaced after a timeout or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None
        self._sys_path: list[str] = []
        self.started = 0
        """Worker processes started so far (1 + the number of replacements)."""

    @property
    def pid(self) -> int | None:
        """The live worker process's id (None before the first call or after a kill)."""
        process = self._process
        return None if process is None else process.pid

    def call(self, name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float | None,
             max_chars: int) -> str:
        """``fn(**kwargs)`` in the worker: its string result, or :class:`ToolFailure` when it raised,
        exited, returned a non-string, died or ran past ``timeout_s`` (then the worker is killed)."""
        with self._lock:
            conn = self._ensure()
            try:
                conn.send((fn, dict(kwargs), max_chars))
                ready = conn.poll(timeout_s)
                reply = conn.recv() if ready else None
            except (EOFError, OSError, BrokenPipeError):
                code = self._kill()
                raise ToolFailure(f"tool {name}: its worker process died (exit code {code})") from None
            except BaseException:  # Ctrl-C while waiting: do not leave the call running
                self._kill()
                raise
            if reply is None:
                self._kill()
                raise ToolFailure(f"tool {name} timed out after {timeout_s:g} s (its worker process was killed)")
        kind, payload = reply
        if kind == "ok":
            return payload
        if kind == "raised":
            raise ToolFailure(f"tool {name} raised {payload}")
        if kind == "exit":
            raise ToolFailure(f"tool {name} called exit({payload})")
        raise ToolFailure(f"tool {name} returned {payload}, expected str")

    def _ensure(self) -> Connection:
        """The live worker; a new one when there is none or ``sys.path`` changed since it started
        (a worker imports tools with the ``sys.path`` it was started with)."""
        alive = self._process is not None and self._process.is_alive() and self._conn is not None
        if alive and self._sys_path == sys.path:
            return self._conn  # type: ignore[return-value]
        self._kill()
        self._sys_path = list(sys.path)
        ours, theirs = _CONTEXT.Pipe()
        process = _CONTEXT.Process(target=_serve, args=(theirs, os.getpid()), name="tracerl-tool-worker",
                                   daemon=True)
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        self.started += 1
        return ours

    def interrupt(self) -> None:
        """SIGKILL the worker from another thread (its caller, waiting on the pipe, then fails the
        call as a dead worker and reaps it): the driver stopping while pool threads wait."""
        process = self._process
        try:
            if process is not None:
                process.kill()
        except (ValueError, OSError):  # already closed or reaped by its caller
            pass

    def _kill(self) -> int | None:
        """Stop the worker (SIGKILL) and reap it; its exit code."""
        process, conn, self._process, self._conn = self._process, self._conn, None, None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        if process.is_alive():
            process.kill()
        process.join()
        code = process.exitcode
        process.close()
        return code

    def close(self) -> None:
        with self._lock:
            self._kill()


class WorkerPool:
    """Isolated workers, one call each at a time: a call takes an idle worker or starts a new one
    (at most ``max_workers``; past that it waits for one), and gives it back when done."""

    def __init__(self, max_workers: int = MAX_WORKERS) -> None:
        self.max_workers = max_workers
        self._cond = threading.Condition()
        self._idle: list[IsolatedWorker] = []
        self._busy: set[IsolatedWorker] = set()
        self._retired = 0  # processes started by workers dropped at close()

    @property
    def started(self) -> int:
        """Worker processes started so far (every worker's first start and its replacements)."""
        with self._cond:
            return self._retired + sum(w.started for w in [*self._idle, *self._busy])

    @property
    def size(self) -> int:
        """Workers held (idle and busy)."""
        with self._cond:
            return len(self._idle) + len(self._busy)

    def call(self, name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float | None,
             max_chars: int) -> str:
        """:meth:`IsolatedWorker.call` on a worker of this pool."""
        worker = self._acquire()
        try:
            return worker.call(name, fn, kwargs, timeout_s, max_chars)
        finally:
            with self._cond:
                self._busy.discard(worker)
                self._idle.append(worker)
                self._cond.notify()

    def _acquire(self) -> IsolatedWorker:
        with self._cond:
            while not self._idle and len(self._busy) >= self.max_workers:
                self._cond.wait()
            worker = self._idle.pop() if self._idle else IsolatedWorker()
            self._busy.add(worker)
            return worker

    def interrupt(self) -> None:
        """Kill every busy worker (their calls fail): the driver stops and must not leave calls running."""
        with self._cond:
            busy = list(self._busy)
        for worker in busy:
            worker.interrupt()

    def close(self) -> None:
        """Kill every idle worker (busy ones are interrupted, and stopped by their callers)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._retired += sum(w.started for w in idle)
        for worker in idle:
            worker.close()
        self.interrupt()


_POOL = WorkerPool()
atexit.register(_POOL.close)


def call_isolated(name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float | None,
                  max_chars: int) -> str:
    """:meth:`WorkerPool.call` on the process's shared pool."""
    return _POOL.call(name, fn, kwargs, timeout_s, max_chars)


def shared_worker() -> WorkerPool:
    """The pool :func:`call_isolated` uses (tests and benchmarks read ``started`` and ``size``)."""
    return _POOL


def interrupt_isolated() -> None:
    """Kill the shared pool's busy workers (the rollout engine, stopping on an error or Ctrl-C)."""
    _POOL.interrupt()
