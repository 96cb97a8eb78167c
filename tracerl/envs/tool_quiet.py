"""Tools that keep quiet: a tool's prints never reach the trainer's console, its forks never run on.

:class:`in_tool` marks the thread that runs an in-process tool call (:mod:`tracerl.envs.tools`).
While marked, the thread's writes to ``sys.stdout`` and ``sys.stderr`` are dropped
(:class:`_ToolQuiet`, put in front of both streams on the first call): a tool printing 5 MB became
92,166 lines of the trainer's output. A tool that calls ``os.fork()`` gets a child whose stdout and
stderr go to ``/dev/null`` and which ends (``os._exit(0)``) when the tool returns in it: before,
the child ran on as a copy of the trainer and died printing a 646-line fatal error. Isolated tools
are silenced in their worker process (:mod:`tracerl.envs.isolation`).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_TOOL_THREAD = threading.local()


class in_tool:  # noqa: N801 - used as a context manager, reads like one
    """Marks this thread as running a tool: a fork inside the tool gives a child that prints
    nothing and ends when the tool returns in it, instead of running the trainer's code on
    (see :func:`_silence_forked_tool`)."""

    def __enter__(self) -> None:
        self.pid, self.outer = os.getpid(), getattr(_TOOL_THREAD, "active", False)  # a tool may call a tool
        _TOOL_THREAD.active = True
        _hush_tool_prints()

    def __exit__(self, *exc: object) -> None:
        _TOOL_THREAD.active = self.outer
        if os.getpid() != self.pid:  # the child of a fork made by the tool: it must not go on
            os._exit(0)


class _ToolQuiet:
    """``sys.stdout``/``sys.stderr`` while in-process tools run: what a tool's thread prints is
    dropped (a chatty tool would flood the trainer's console: 5 MB became 92,166 lines), every
    other thread's text goes to the stream it replaced."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, text: str) -> int:
        if getattr(_TOOL_THREAD, "active", False):
            return len(text)
        written = self.real.write(text)  # Ray's worker streams return None
        return len(text) if written is None else int(written)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return bool(self.real.isatty())

    def fileno(self) -> int:
        return int(self.real.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _hush_tool_prints() -> None:
    """Put :class:`_ToolQuiet` in front of ``sys.stdout`` and ``sys.stderr`` (again, when something
    replaced them since: a test's capture, ``contextlib.redirect_stdout``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ToolQuiet):
            setattr(sys, name, _ToolQuiet(stream))


def _silence_forked_tool() -> None:
    """After ``os.fork()`` in a tool (this thread is marked): the child's stdout and stderr go to
    /dev/null, so its exit cannot print the trainer's threads' fatal errors."""
    if getattr(_TOOL_THREAD, "active", False):
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(null, fd)
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_silence_forked_tool)


