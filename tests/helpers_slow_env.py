"""A ``data.environment`` factory for the concurrent-tool tests: the built-in bm25s search whose
every call is held back a little (an event wait keyed on the query), so calls finish in an order
unrelated to the order they were made in. ``helpers_slow_env:jittered_search_environment``."""

from __future__ import annotations

import threading
import zlib
from typing import Any

from tracerl.envs.base import ToolEnvironment
from tracerl.envs.environments import EnvSettings, search
from tracerl.envs.tools import ToolSet


def jittered_search_environment(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    env = search(documents, settings)
    tools = env.tools

    def search_(query: str) -> str:
        """Search the corpus; returns the best matching documents as 'title: text' lines."""
        threading.Event().wait((zlib.crc32(query.encode()) % 5) / 200)
        return tools.call("search", {"query": query})

    def open_(title: str) -> str:
        """Open a document by its id, or by its title when only one document has that title."""
        threading.Event().wait((zlib.crc32(title.encode()) % 5) / 200)
        return tools.call("open", {"title": title})

    from tracerl.envs.tools import Tool

    env.tools = ToolSet([Tool.from_function(search_, name="search"), Tool.from_function(open_, name="open")])
    return env
