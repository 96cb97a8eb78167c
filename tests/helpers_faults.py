"""Faulty and hostile tools for the fault tests, importable by path (``helpers_faults:name``) so
they can be plug-in tools (``data.tools``) and run in an isolated worker process."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from tracerl.envs.base import ToolEnvironment
from tracerl.envs.environments import EnvSettings, search
from tracerl.envs.tools import Tool, ToolSet


def echo(query: str) -> str:
    """Repeat the query."""
    return f"got {query}"


def backtrack(query: str) -> str:
    """A catastrophic-backtracking regex: holds the GIL for minutes (2^40 paths on 40 'a's)."""
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
    """End the worker process without a word (as a segfault or the OOM killer would)."""
    os._exit(9)


def dead_search_environment(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    """The built-in search environment whose ``search`` backend is down (``open`` still works)."""
    env = search(documents, settings)

    def search_down(query: str) -> str:
        """Search the corpus."""
        raise ConnectionError("search backend down")

    env.tools = ToolSet([Tool.from_function(search_down, name="search"), env.tools["open"]])
    return env
