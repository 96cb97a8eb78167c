"""Tool calls in a worker process that can be killed: a hung tool cannot stall the run.

A thread cannot be killed, and a tool that hangs while holding the GIL (a catastrophic-backtracking
regex) stops every thread of the trainer, the one waiting for the timeout included. An
*isolated* tool (:attr:`~tracerl.envs.tools.Tool.isolated`: plug-in tools of ``data.tools`` by
default, any tool that opts in) runs in a separate process instead; on timeout that process is
killed (SIGKILL) and a fresh one is started for the next call.

One worker serves every isolated tool of the process (tools are called one at a time by the
rollout engine). Workers come from a ``forkserver`` (``spawn`` where there is none): never a fork
of the trainer, which holds torch's threads, and a replacement starts in milliseconds. An
isolated tool must therefore be importable: a module-level function, pickled by reference. The worker
ignores SIGINT: the user's Ctrl-C reaches the trainer, which kills the worker and stops. Results
and failure messages are cut to ``max_chars`` in the worker, so a tool returning or raising 10 MB
never sends them. Overhead per call: see ``benchmarks/tool_isolation.py``.
"""

from __future__ import annotations

import atexit
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from tracerl.envs.tool_errors import ToolFailure, bounded_message

_CONTEXT = multiprocessing.get_context(
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")


def _serve(conn: Connection) -> None:
    """The worker's loop: ``(fn, kwargs, max_chars)`` in, ``(kind, payload)`` out, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    while True:
        try:
            fn, kwargs, max_chars = conn.recv()
        except (EOFError, OSError):  # the trainer went away
            return
        except Exception as exc:  # noqa: BLE001 - the tool's module cannot be imported here
            conn.send(("raised", f"{type(exc).__name__} in the worker process: {bounded_message(str(exc))}"))
            continue
        try:
            result = fn(**kwargs)
            reply = ("ok", result[:max_chars]) if isinstance(result, str) else ("type", type(result).__name__)
        except SystemExit as exc:
            reply = ("exit", repr(exc.code))
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt here is the tool's own, not the user's
            reply = ("raised", f"{type(exc).__name__}: {bounded_message(str(exc))}")
        conn.send(reply)


class IsolatedWorker:
    """A killable worker process for tool calls; replaced after a timeout or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None
        self._sys_path: list[str] = []
        self.started = 0
        """Worker processes started so far (1 + the number of replacements)."""

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
        process = _CONTEXT.Process(target=_serve, args=(theirs,), name="tracerl-tool-worker", daemon=True)
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        self.started += 1
        return ours

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


_WORKER = IsolatedWorker()
atexit.register(_WORKER.close)


def call_isolated(name: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float | None,
                  max_chars: int) -> str:
    """:meth:`IsolatedWorker.call` on the process's shared worker."""
    return _WORKER.call(name, fn, kwargs, timeout_s, max_chars)


def shared_worker() -> IsolatedWorker:
    """The worker :func:`call_isolated` uses (tests and benchmarks read ``started``)."""
    return _WORKER
