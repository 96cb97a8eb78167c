"""Typed tools: a plain Python function is a tool.

The function's name is the tool name, the first paragraph of its docstring the description
and its type-hinted parameters the argument schema, so a user adds a tool by writing a
function (as in TRL's typed tools). :class:`ToolSet` checks arguments before calling: a
wrong call is the policy's fault (:class:`ToolCallError`), an exception inside the tool is
the environment's (:class:`ToolFailure`).

Exceptions outside ``Exception`` are decided one by one: ``SystemExit`` raised by a
tool (``sys.exit`` in a script turned into a tool) is a :class:`ToolFailure` of that call, so
a tool can never end the trainer; ``KeyboardInterrupt`` propagates, because it is the user's
Ctrl-C. :func:`call_with_timeout` runs a call on a daemon thread so a hung tool is abandoned
without keeping the process alive.

Where a tool runs: in-process by default (the built-in bm25s ``search``/``open``, which only
read an in-memory index); in a worker process that is killed at the timeout when the tool is
:attr:`Tool.isolated` (:mod:`tracerl.envs.isolation`; plug-in tools of ``data.tools`` are, unless
``data.isolate_tools = false``). A thread cannot be killed: an in-process tool that hangs holding
the GIL stalls the run, an isolated one cannot.

Bounded output: a tool's text is cut to ``max_chars`` characters and a failure's message to
:data:`~tracerl.envs.tool_errors.MAX_FAILURE_CHARS`, so a tool returning or raising 10 MB costs
nothing downstream. The two errors and the message bound live in :mod:`tracerl.envs.tool_errors`
(the worker process raises them too) and are re-exported here.
"""

from __future__ import annotations

import inspect
import pickle
import re
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tracerl.envs.tool_errors import (  # noqa: F401 - MAX_FAILURE_CHARS re-exported (home: tool_errors.py)
    MAX_FAILURE_CHARS,
    ToolCallError,
    ToolFailure,
    bounded_message,
)

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
RESERVED_NAMES = frozenset({"answer"})
_NON_SPACE = re.compile(r"\S+")
CHARS_PER_TOKEN = 64
"""A tool's text is cut to ``max_observation_tokens * CHARS_PER_TOKEN`` characters before the
engine tokenises it (a longer token is rare in any vocabulary), bounding a 10 MB result's cost."""


@dataclass(frozen=True)
class Parameter:
    name: str
    type: type
    required: bool
    default: Any = None


@dataclass(frozen=True)
class Tool:
    """A callable with the schema read from its signature."""

    name: str
    description: str
    parameters: tuple[Parameter, ...]
    fn: Callable[..., str]
    isolated: bool = False
    """Run each call in a worker process that is killed at the timeout (see envs/isolation.py);
    ``fn`` must then be importable (a module-level function)."""

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, isolated: bool = False) -> Tool:
        """Build a tool from a function with type hints on every parameter and a docstring."""
        tool_name = name or fn.__name__
        if isolated:
            check_importable(fn, tool_name)
        if not tool_name.isidentifier():
            raise ValueError(f"tool name {tool_name!r} must be an identifier")
        if tool_name in RESERVED_NAMES:
            raise ValueError(f"tool name {tool_name!r} is reserved for the final answer")
        doc = inspect.getdoc(fn)
        if not doc:
            raise ValueError(f"tool {tool_name!r} needs a docstring (it becomes the description)")
        hints = typing.get_type_hints(fn)
        params = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ValueError(f"tool {tool_name!r}: *args/**kwargs are not allowed")
            kind = hints.get(p.name)
            if kind not in _JSON_TYPES:
                raise ValueError(f"tool {tool_name!r}: parameter {p.name!r} needs a str/int/float/bool hint")
            required = p.default is inspect.Parameter.empty
            params.append(Parameter(p.name, kind, required, None if required else p.default))
        return cls(tool_name, doc.split("\n\n")[0].replace("\n", " "), tuple(params), fn, isolated)

    def schema(self) -> dict[str, Any]:
        """JSON-schema style description (what chat templates put in their tool list)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {p.name: {"type": _JSON_TYPES[p.type]} for p in self.parameters},
                "required": [p.name for p in self.parameters if p.required],
            },
        }

    def check(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments; raises :class:`ToolCallError` naming the problem."""
        known = {p.name: p for p in self.parameters}
        extra = sorted(set(arguments) - set(known))
        if extra:
            raise ToolCallError(f"{self.name} got unexpected argument {extra[0]}")
        out: dict[str, Any] = {}
        for p in self.parameters:
            if p.name not in arguments:
                if p.required:
                    raise ToolCallError(f"{self.name} is missing argument {p.name}")
                continue
            value = arguments[p.name]
            ok = isinstance(value, p.type) and not (isinstance(value, bool) and p.type is not bool)
            if p.type is float and isinstance(value, int) and not isinstance(value, bool):
                ok, value = True, float(value)
            if not ok:
                raise ToolCallError(f"{self.name} argument {p.name} must be of type {_JSON_TYPES[p.type]}")
            if p.type is str and not value.strip():
                raise ToolCallError(f"{self.name} argument {p.name} is empty")
            out[p.name] = value
        return out


class ToolSet(Mapping[str, Tool]):
    """Tools by name; :meth:`call` validates, runs and returns the tool's text."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool.from_function(item)
            if tool.name in self._tools:
                raise ValueError(f"duplicate tool name {tool.name!r}")
            self._tools[tool.name] = tool

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float | None = None,
             max_chars: int | None = None) -> str:
        """Run a tool. ToolCallError: the call was wrong; ToolFailure: the tool broke or ran past
        ``timeout_s`` seconds (None: no limit). The text is cut to ``max_chars`` characters."""
        if name not in self._tools:
            raise ToolCallError(f"unknown tool {name}")
        tool = self._tools[name]
        kwargs = tool.check(arguments)
        limit = max_chars if max_chars is not None else 2**62
        if tool.isolated:
            from tracerl.envs.isolation import call_isolated  # loaded on the first isolated call

            return call_isolated(name, tool.fn, kwargs, timeout_s, limit)
        if timeout_s is None:
            return _invoke(tool, kwargs, limit)
        return call_with_timeout(lambda: _invoke(tool, kwargs, limit), timeout_s, what=f"tool {name}")


def _invoke(tool: Tool, kwargs: dict[str, Any], max_chars: int) -> str:
    """``tool.fn(**kwargs)`` in this process, its failures as :class:`ToolFailure` (bounded messages)."""
    name = tool.name
    try:
        result = tool.fn(**kwargs)
    except Exception as exc:  # any exception inside a tool is the environment's fault
        raise ToolFailure(f"tool {name} raised {type(exc).__name__}: {bounded_message(str(exc))}") from exc
    except SystemExit as exc:  # a tool must not end the trainer; KeyboardInterrupt still propagates
        raise ToolFailure(f"tool {name} called exit({bounded_message(repr(exc.code))})") from exc
    if not isinstance(result, str):
        raise ToolFailure(f"tool {name} returned {type(result).__name__}, expected str")
    return result[:max_chars]


def check_importable(fn: Callable[..., Any], name: str) -> None:
    """An isolated tool's function must pickle by reference (a worker process imports it)."""
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        raise ValueError(f"tool {name!r} runs isolated, so it must be a module-level function that a worker "
                         f"process can import ({type(err).__name__}: {bounded_message(str(err), 200)})") from None


def call_with_timeout(fn: Callable[[], str], timeout_s: float, what: str = "tool call") -> str:
    """``fn()``, or :class:`ToolFailure` when it has not returned within ``timeout_s`` seconds.

    The call runs on a daemon thread that is abandoned on timeout: Python cannot kill a
    thread, but a daemon one never blocks interpreter exit (a ``ThreadPoolExecutor`` worker
    does, so a hung tool kept the trainer alive forever). The abandoned call may keep running
    in the background until it returns. Whatever ``fn`` raises, ``KeyboardInterrupt``
    included, is re-raised here in the caller's thread.
    """
    done = threading.Event()
    slot: list[Any] = []

    def target() -> None:
        try:
            slot.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which decides
            slot.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, name=f"tracerl-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise ToolFailure(f"{what} timed out after {timeout_s:g} s")
    ok, value = slot.pop()
    if not ok:
        try:
            raise value
        finally:  # no cycle exception -> traceback -> this frame -> exception (a 10 MB message would wait for gc)
            value = None
    return value


def truncate_words(text: str, max_tokens: int) -> str:
    """Keep the first ``max_tokens`` whitespace words, layout intact (" ..." marks a cut)."""
    for count, match in enumerate(_NON_SPACE.finditer(text), start=1):
        if count == max_tokens:
            rest = text[match.end():]
            return text[: match.end()] + " ..." if rest.strip() else text
    return text
