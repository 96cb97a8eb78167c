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

Concurrency: the rollout engine calls tools of different episodes at once
(:mod:`tracerl.rollout.tool_calls`), so a tool must be safe to call from several threads (the
built-in ones only read). ``async def`` tools are awaited on one event-loop thread; a tool with a
batch form (:attr:`Tool.batch`) sends calls arriving together as one batch
(:mod:`tracerl.envs.tool_batch`).

Quiet tools: what an in-process tool prints is dropped (its thread's writes to ``sys.stdout`` and
``sys.stderr``; isolated workers print to ``/dev/null``), and a tool that calls ``os.fork()`` gets
a child that prints nothing and ends when the tool returns in it, instead of running on as a copy
of the trainer.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tracerl.envs.tool_batch import Batcher
from tracerl.envs.tool_quiet import in_tool
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
    fn: Callable[..., Any]
    isolated: bool = False
    """Run each call in a worker process that is killed at the timeout (see envs/isolation.py);
    ``fn`` must then be importable (a module-level function)."""
    batch: Callable[..., Any] | None = None
    """The tool's batch form (in-process tools only; see :mod:`tracerl.envs.tool_batch`): called
    with one list per parameter of ``fn`` (in order, defaults filled in), it returns one text per
    call, e.g. ``search_many(queries: list[str]) -> list[str]``; may be ``async def``."""
    batch_window_s: float = 0.005
    """How long the first call of a batch waits for others before the batch is sent."""
    max_batch: int = 64
    """Calls sent together at most (a full batch is sent at once)."""

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, isolated: bool = False,
                      batch: Callable[..., Any] | None = None, batch_window_s: float = 0.005,
                      max_batch: int = 64) -> Tool:
        """Build a tool from a function with type hints on every parameter and a docstring
        (``async def`` functions are awaited); ``batch``: its batch form (see :attr:`batch`)."""
        tool_name = name or fn.__name__
        if batch is not None and not callable(batch):
            raise ValueError(f"tool {tool_name!r}: batch must be a function, got {type(batch).__name__}")
        if not batch_window_s >= 0 or max_batch < 1:
            raise ValueError(f"tool {tool_name!r}: need batch_window_s >= 0 and max_batch >= 1, "
                             f"got {batch_window_s} and {max_batch}")
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
        return cls(tool_name, doc.split("\n\n")[0].replace("\n", " "), tuple(params), fn, isolated,
                   batch, batch_window_s, max_batch)

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
        self._batchers: dict[str, Batcher] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool.from_function(item)
            if tool.name in self._tools:
                raise ValueError(f"duplicate tool name {tool.name!r}")
            self._tools[tool.name] = tool
            if tool.batch is not None and not tool.isolated:
                self._batchers[tool.name] = Batcher(tool, _invoke_batch)

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
        if name in self._batchers:
            return self._batchers[name].call(kwargs, timeout_s, limit)
        if inspect.iscoroutinefunction(tool.fn):  # awaited on the shared event loop: no thread per call
            return _invoke(tool, kwargs, limit, timeout_s)
        if timeout_s is None:
            return _invoke(tool, kwargs, limit)
        return call_with_timeout(lambda: _invoke(tool, kwargs, limit), timeout_s, what=f"tool {name}")


def _invoke(tool: Tool, kwargs: dict[str, Any], max_chars: int, timeout_s: float | None = None) -> str:
    """``tool.fn(**kwargs)`` in this process, its failures as :class:`ToolFailure` (bounded messages).
    A coroutine it returns is awaited (``timeout_s`` bounds that wait)."""
    name = tool.name
    with in_tool():
        try:
            result = _settle(tool.fn(**kwargs), timeout_s, f"tool {name}")
        except ToolFailure:
            raise
        except Exception as exc:  # any exception inside a tool is the environment's fault
            raise ToolFailure(f"tool {name} raised {type(exc).__name__}: {bounded_message(str(exc))}") from exc
        except SystemExit as exc:  # a tool must not end the trainer; KeyboardInterrupt still propagates
            raise ToolFailure(f"tool {name} called exit({bounded_message(repr(exc.code))})") from exc
    if not isinstance(result, str):
        raise ToolFailure(f"tool {name} returned {type(result).__name__}, expected str")
    return result[:max_chars]


def _invoke_batch(tool: Tool, columns: list[list[Any]], timeout_s: float | None) -> list[Any]:
    """``tool.batch(*columns)`` in this process under ``timeout_s``; failures as :class:`ToolFailure`."""
    assert tool.batch is not None
    batch = tool.batch

    def run() -> Any:
        with in_tool():
            try:
                return _settle(batch(*columns), timeout_s, f"tool {tool.name}")
            except ToolFailure:
                raise
            except Exception as exc:  # noqa: BLE001 - the environment's fault, as for a single call
                raise ToolFailure(f"tool {tool.name} raised {type(exc).__name__}: {bounded_message(str(exc))}") from exc
            except SystemExit as exc:
                raise ToolFailure(f"tool {tool.name} called exit({bounded_message(repr(exc.code))})") from exc

    if timeout_s is None or inspect.iscoroutinefunction(batch):
        return run()  # type: ignore[no-any-return]
    return call_with_timeout(run, timeout_s, what=f"tool {tool.name}")  # type: ignore[return-value]


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The event loop ``async def`` tools run on: one daemon thread, started on first use."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="tracerl-async-tools", daemon=True).start()
        return _LOOP


def _settle(value: Any, timeout_s: float | None, what: str) -> Any:
    """``value``, or its result when it is a coroutine (awaited on :func:`_event_loop`)."""
    if not inspect.iscoroutine(value):
        return value
    future = asyncio.run_coroutine_threadsafe(value, _event_loop())
    try:
        return future.result(timeout_s)
    except TimeoutError:
        future.cancel()
        raise ToolFailure(f"{what} timed out after {timeout_s:g} s") from None
    except BaseException:
        future.cancel()  # Ctrl-C while waiting: do not leave the coroutine running
        raise


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
