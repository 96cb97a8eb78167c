"""A tool environment with a dead backend, importable by path (``helpers_faults:name``) as
``data.environment``; hostile single tools are in helpers_tools.py."""

from __future__ import annotations

from typing import Any

from tracerl.envs.base import ToolEnvironment
from tracerl.envs.environments import EnvSettings, search
from tracerl.envs.tools import Tool, ToolSet


def dead_search_environment(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    """The built-in search environment whose ``search`` backend is down (``open`` still works)."""
    env = search(documents, settings)

    def search_down(query: str) -> str:
        """Search the corpus."""
        raise ConnectionError("search backend down")

    env.tools = ToolSet([Tool.from_function(search_down, name="search"), env.tools["open"]])
    return env


def hung_search(query: str) -> str:
    """Search the corpus (with a catastrophic-backtracking regex that holds the GIL for hours)."""
    import re

    return "match" if re.match(r"(a+)+$", "a" * 40 + "b") else "no match"


def hung_search_environment(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    """The built-in search environment whose ``search`` hangs holding the GIL, isolated (opted in)."""
    env = search(documents, settings)
    env.tools = ToolSet([Tool.from_function(hung_search, name="search", isolated=True), env.tools["open"]])
    return env
