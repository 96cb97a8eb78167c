"""Hostile plug-in tools (standard library only, so a worker process imports them in a blink):
``helpers_tools:name`` in ``data.tools``, or ``Tool.from_function(fn, isolated=True)``."""

from __future__ import annotations

import os
import re
import time


def echo(query: str) -> str:
    """Repeat the query."""
    return f"got {query}"


def worker_pid(query: str) -> str:
    """The id of the process the call runs in."""
    return str(os.getpid())


def backtrack(query: str) -> str:
    """A catastrophic-backtracking regex: holds the GIL for hours (2^40 paths on 40 'a's)."""
    return "match" if re.match(r"(a+)+$", "a" * 40 + "b") else "no match"


def sleepy(query: str) -> str:
    """Sleep far longer than any test's timeout."""
    time.sleep(600)
    return "late"


def huge_error(query: str) -> str:
    """Raise with a 10 MB message."""
    raise RuntimeError("x" * 10_000_000)


def huge_result(query: str) -> str:
    """Return 10 MB of text without a space (one 'word')."""
    return "y" * 10_000_000


def dies(query: str) -> str:
    """End the process without a word (as a segfault or the OOM killer would)."""
    os._exit(9)


def quits(query: str) -> str:
    """A script turned into a tool that calls sys.exit."""
    raise SystemExit(3)
