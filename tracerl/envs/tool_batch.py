"""Batched tool calls: calls of one tool arriving within a short window are sent together.

A tool may declare a batch form (:attr:`~tracerl.envs.tools.Tool.batch`), e.g. a retriever whose
server takes a list of queries per request (Search-R1's ``/retrieve``)::

    def search(query: str) -> str: ...                      # the form the policy calls
    def search_many(query: list[str]) -> list[str]: ...     # one list per parameter, one text per call
    tool = Tool.from_function(search, batch=search_many, batch_window_s=0.005, max_batch=64)

The rollout engine runs tool calls of different episodes concurrently (each on a pool thread), so
calls arrive together. The first call of a batch waits ``batch_window_s`` (or until ``max_batch``
calls joined), then runs the batch form once on its own thread and hands every caller its text;
the others wait for it. Each caller gets the text of its own call (by position in the batch), so
results never depend on which calls shared a batch, as long as the batch form answers each call as
the single form would. A batch that fails (raises, times out, returns the wrong number of texts)
fails every call in it as a :class:`~tracerl.envs.tool_errors.ToolFailure`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.tool_errors import ToolFailure

BatchRunner = Callable[[Any, list[list[Any]], "float | None"], list[Any]]
"""Runs ``tool.batch(*columns)`` under a timeout (``tracerl.envs.tools._invoke_batch``); the tool is a
:class:`~tracerl.envs.tools.Tool` (not imported here: that module imports this one)."""


@dataclass
class _Slot:
    kwargs: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: str | None = None
    error: BaseException | None = None


@dataclass
class _Batch:
    slots: list[_Slot] = field(default_factory=list)
    full: threading.Event = field(default_factory=threading.Event)


class Batcher:
    """Collects concurrent calls of one tool into batches (see the module docstring)."""

    def __init__(self, tool: Any, run: BatchRunner) -> None:
        self.tool, self.run = tool, run
        self._lock = threading.Lock()
        self._open: _Batch | None = None
        self.batches = 0
        """Batches sent so far (tests and benchmarks read it)."""
        self.largest = 0
        """The most calls one batch held."""

    def call(self, kwargs: dict[str, Any], timeout_s: float | None, max_chars: int) -> str:
        """This call's text, after it was sent in a batch (the caller's thread may send it)."""
        slot = _Slot(kwargs)
        with self._lock:
            batch, lead = self._open, self._open is None
            if batch is None:
                batch = self._open = _Batch()
            batch.slots.append(slot)
            if len(batch.slots) >= self.tool.max_batch:
                self._open = None  # closed: the next call starts a new batch
                batch.full.set()
        if lead:
            batch.full.wait(self.tool.batch_window_s)
            with self._lock:
                if self._open is batch:
                    self._open = None
            self._send(batch.slots, timeout_s, max_chars)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    def _send(self, slots: list[_Slot], timeout_s: float | None, max_chars: int) -> None:
        names = [p.name for p in self.tool.parameters]
        defaults = {p.name: p.default for p in self.tool.parameters}
        columns = [[s.kwargs.get(n, defaults[n]) for s in slots] for n in names]
        self.batches += 1
        self.largest = max(self.largest, len(slots))
        try:
            texts = self._texts(self.run(self.tool, columns, timeout_s), len(slots))
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch re-raises it
            for s in slots:
                s.error = ToolFailure(str(exc)) if isinstance(exc, ToolFailure) else exc
                s.done.set()
            return
        for s, text in zip(slots, texts, strict=True):
            s.result = text[:max_chars]
            s.done.set()

    def _texts(self, result: Any, calls: int) -> list[str]:
        name = self.tool.name
        if not isinstance(result, list | tuple) or len(result) != calls:
            got = f"{len(result)} items" if isinstance(result, list | tuple) else type(result).__name__
            raise ToolFailure(f"tool {name}'s batch form returned {got} for {calls} calls, expected a list of {calls} str")
        wrong = next((type(t).__name__ for t in result if not isinstance(t, str)), None)
        if wrong is not None:
            raise ToolFailure(f"tool {name}'s batch form returned a {wrong} in its list, expected str")
        return list(result)
