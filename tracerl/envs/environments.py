"""Environment factories by name or import path, and extra tools given as import paths.

An environment factory builds the :class:`ToolEnvironment` of one corpus::

    def my_environment(documents: list[Document], settings: EnvSettings) -> ToolEnvironment: ...

``settings`` carries what training, evaluation and env-check share: the search depth and the
episode limits (:class:`~tracerl.envs.base.EnvConfig`, derived from the engine's config). The
built-in ``search`` factory is bm25s ``search``/``open`` (:func:`tracerl.envs.search.search_environment`);
``http_search`` is the same two tools over a retrieval server (:mod:`tracerl.envs.http_search`).
``data.environment`` names a registered factory or ``package.module:factory``.

``data.tools`` adds typed Python functions (``package.module:function``, see
:class:`~tracerl.envs.tools.Tool`) to whatever tools the factory built: :func:`build_environment`
appends them, so a custom factory never has to handle them itself. They run *isolated* by
default (a worker process killed at ``data.tool_timeout_s``, see :mod:`tracerl.envs.isolation`):
a plug-in tool is code this library has not seen, and only a process can be killed when it hangs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tracerl.core.registry import Registry, RegistryError, resolve_import_path
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.plugins import SignedRegistry
from tracerl.envs.tool_errors import bounded_message
from tracerl.envs.tools import Tool, ToolSet, check_importable


@dataclass(frozen=True)
class EnvSettings:
    """What an environment factory is told about the run."""

    top_k: int = 3
    """Documents one search returns."""
    config: EnvConfig = EnvConfig()
    """Episode limits and the tool timeout (one definition shared by every path)."""
    retriever_url: str = ""
    """``http_search``: the retrieval server's URL (``data.retriever_url``)."""
    retriever_retries: int = 3
    """``http_search``: retries of a failed request before the call is an infrastructure failure."""


EnvironmentFactory = Callable[[Any, EnvSettings], ToolEnvironment]
ENVIRONMENTS: Registry[EnvironmentFactory] = SignedRegistry("environment", "f(documents, settings)", 2)
"""Environment factories by name; ``get`` also resolves ``package.module:factory``."""


@ENVIRONMENTS.register("search")
def search(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    """bm25s ``search(query)`` and ``open(title)`` over ``documents`` (a list or a SearchIndex)."""
    from tracerl.envs.search import search_environment  # bm25s: imported only when used

    return search_environment(documents, settings.top_k, settings.config, settings.config.tool_timeout_s)


@ENVIRONMENTS.register("http_search")
def http_search(documents: Any, settings: EnvSettings) -> ToolEnvironment:
    """``search``/``open`` over a retrieval server at ``settings.retriever_url`` (Search-R1's ``/retrieve``
    API; ``tracerl serve-retriever`` serves one). ``documents`` is not read: the server holds the corpus."""
    from tracerl.envs.http_search import http_search_environment  # httpx: imported only when used

    return http_search_environment(settings.retriever_url, settings.top_k, settings.config, settings.retriever_retries)


def load_tool(path: str, isolate: bool = True) -> Tool:
    """The typed function at ``package.module:function`` as a :class:`Tool` (one-line errors);
    ``isolate``: it runs in a killable worker process (see the module docstring)."""
    fn = resolve_import_path(path, "tool")
    if not isinstance(fn, Tool) and not callable(fn):
        raise RegistryError(f"tool {path!r} is a {type(fn).__name__}, not a function")
    try:
        if not isinstance(fn, Tool):
            return Tool.from_function(fn, isolated=isolate)
        if isolate:
            check_importable(fn.fn, fn.name)
        return replace(fn, isolated=isolate or fn.isolated)
    except ValueError as err:
        raise RegistryError(f"tool {path!r}: {err}") from None


def load_tools(paths: Sequence[str], isolate: bool = True) -> list[Tool]:
    """:func:`load_tool` of each path, in order."""
    return [load_tool(p, isolate) for p in paths]


def build_environment(name: str, documents: Any, settings: EnvSettings,
                      tools: Sequence[str | Tool] = (), isolate: bool = True) -> ToolEnvironment:
    """The environment factory ``name`` applied to ``documents``, with ``tools`` appended
    (those given as import paths run isolated when ``isolate``).

    A factory's result must be a :class:`ToolEnvironment`; a tool whose name the factory already
    uses is an error naming both (the policy could not tell them apart).
    """
    factory = ENVIRONMENTS.get(name)
    try:
        env = factory(documents, settings)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - a plug-in factory fails in any way (sys.exit too): one line
        raise RegistryError(f"data.environment {name!r} raised {type(err).__name__} while building the "
                            f"environment: {bounded_message(' '.join(str(err).split()), 300)}") from None
    if not isinstance(env, ToolEnvironment):
        raise RegistryError(f"environment {name!r} returned a {type(env).__name__}, not a ToolEnvironment")
    extra = [load_tool(t, isolate) if isinstance(t, str) else t for t in tools]
    if not extra:
        return env
    clash = sorted(set(env.tools) & {t.name for t in extra})
    if clash:
        raise RegistryError(f"data.tools: tool {clash[0]!r} clashes with a tool of environment {name!r} "
                            f"({', '.join(env.tools)})")
    env.tools = ToolSet([*env.tools.values(), *extra])
    return env
