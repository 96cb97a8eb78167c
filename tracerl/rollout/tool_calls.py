"""Concurrent tool calls: episodes' environment steps on a bounded pool of threads.

An episode's step (``episode.step(action)``: the tool call, its timeout, the observation) only
touches that episode, so steps of different episodes can run at once. :class:`ToolRunner` runs
them on at most ``rollout.engine.tool_concurrency`` threads (the bound on calls in flight; 0: each
step inline on the caller's thread, one at a time, the path before concurrent tools). Isolated
tools get one worker process per call in flight (:class:`~tracerl.envs.isolation.WorkerPool`),
``async def`` tools are awaited on one event loop, and a tool with a batch form sends the calls
arriving together as one batch (:mod:`tracerl.envs.tool_batch`).

Results are taken by the caller in the order it chooses (the engine applies them in request
order, never arrival order), so a seeded run builds the same trees whatever the concurrency.
:attr:`ToolRunner.in_flight` feeds the progress line (:mod:`tracerl.rollout.progress`).
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tracerl.rollout.progress import current_progress


class ToolRunner:
    """Runs ``episode.step(action)`` calls, at most ``concurrency`` at once (0: inline)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="tracerl-tool") if concurrency > 0 else None
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        """The most calls that were in flight at once (benchmarks report it)."""

    def submit(self, episode: Any, action: Any) -> Future[Any]:
        """Start ``episode.step(action)``; its observation (or exception) is the future's result.
        An answer or an unparsable turn calls no tool: it steps inline."""
        if self._pool is not None and getattr(action, "kind", "tool") == "tool":
            self._started()
            future = self._pool.submit(episode.step, action)
            future.add_done_callback(lambda _: self._ended())
            return future
        done: Future[Any] = Future()
        counted = getattr(action, "kind", "tool") == "tool"
        if counted:
            self._started()
        try:
            done.set_result(episode.step(action))
        except Exception as exc:  # noqa: BLE001 - handed to whoever takes the result, as on a thread
            done.set_exception(exc)
        finally:
            if counted:
                self._ended()
        return done

    def _started(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        current_progress().tool_started()

    def _ended(self) -> None:
        with self._lock:
            self.in_flight -= 1
        current_progress().tool_ended()

    def close(self, failed: bool = False) -> None:
        """Stop the pool: wait for the calls in flight, or, when the caller failed (an error, Ctrl-C),
        drop queued calls and kill the isolated workers still busy so no call keeps running."""
        if self._pool is None:
            return
        if failed:
            isolation = sys.modules.get("tracerl.envs.isolation")  # loaded only once a tool ran isolated
            if isolation is not None:
                isolation.interrupt_isolated()
            self._pool.shutdown(wait=False, cancel_futures=True)
        else:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        self.close(failed=kind is not None)
