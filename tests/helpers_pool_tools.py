"""Plug-in tools for the concurrent-tool tests (standard library only, importable by a worker
process): rendezvous across processes, a marker written before a hang, chatty and forking tools."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path


def rendezvous(query: str) -> str:
    """``folder|n``: leave this process's id in folder, wait until n calls have (at most 60 s), return the id.

    Calls served one at a time by one worker could never all arrive: the test would see a timeout."""
    folder, n = query.split("|")
    (Path(folder) / str(os.getpid())).write_text("here")
    bound = time.monotonic() + 60
    while len(list(Path(folder).iterdir())) < int(n):
        if time.monotonic() > bound:
            return "alone"
        time.sleep(0.01)
    return str(os.getpid())


def mark_then_backtrack(query: str) -> str:
    """Write the file named by ``query``, then hold the GIL for hours (a catastrophic regex)."""
    Path(query).write_text(str(os.getpid()))
    return "match" if re.match(r"(a+)+$", "a" * 40 + "b") else "no match"


def chatty(query: str) -> str:
    """Print 5 MB (100,000 lines) to stdout and stderr, then answer or raise."""
    line = "spam " * 9 + "\n"
    for _ in range(50_000):
        print(line, end="")
        print(line, end="", file=__import__("sys").stderr)
    if query == "fail":
        raise RuntimeError("after printing")
    return "quiet answer"


def forks(query: str) -> str:
    """Fork, and return in both processes (as a careless tool would)."""
    os.fork()
    return f"forked {query}"


async def async_echo(query: str) -> str:
    """Echo, from a coroutine."""
    import asyncio

    await asyncio.sleep(0)
    return f"async {query}"
