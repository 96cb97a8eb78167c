"""Progress inside a step's rollout phase: a live status line, or a heartbeat when not a terminal.

With slow tools a step's rollout phase can take minutes; without a word it looks hung. While a
:func:`step_progress` block runs, the rollout engine reports finished rollouts, generated tokens
and tool calls in flight to :func:`current_progress`, and a daemon thread prints::

    rollouts 12/64 | tool calls in flight 5 | 340 tok/s | 0:12

on a terminal as one line rewritten in place (cleared when the phase ends, so the trainer's step
line follows as usual), elsewhere as a plain line every ``heartbeat_s`` seconds (only once the
phase has run that long: a fast phase prints nothing). Lines fit 80 columns. Outside a block
:func:`current_progress` is a no-op, so the engine reports unconditionally. Only the local
executor's rollouts are seen as they finish; a Ray worker's (its engine runs in its own process)
are counted when its call returns (no tool calls in flight shown for them).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from tracerl.progress import clock

WIDTH = 79
"""Characters of a status line (80 columns, the cursor's included)."""
LIVE_PERIOD_S = 0.5
HEARTBEAT_S = 10.0


class RolloutProgress:
    """Counters of one rollout phase and their one-line rendering."""

    def __init__(self, planned: int) -> None:
        self.planned = planned
        self.rollouts = 0
        self.tokens = 0
        self.tools_in_flight = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def rollout_finished(self) -> None:
        with self._lock:
            self.rollouts += 1

    def generated(self, tokens: int) -> None:
        with self._lock:
            self.tokens += tokens

    def finished_elsewhere(self, rollouts: int, tokens: int) -> None:
        """Rollouts and tokens another process's engine reported (a Ray worker's call came back)."""
        with self._lock:
            self.rollouts += rollouts
            self.tokens += tokens

    def tool_started(self) -> None:
        with self._lock:
            self.tools_in_flight += 1

    def tool_ended(self) -> None:
        with self._lock:
            self.tools_in_flight -= 1

    def line(self, now: float | None = None) -> str:
        """The status line at ``now`` (monotonic seconds), at most :data:`WIDTH` characters."""
        elapsed = max((time.monotonic() if now is None else now) - self.started, 0.0)
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        text = (f"rollouts {self.rollouts}/{self.planned} | tool calls in flight {self.tools_in_flight} | "
                f"{rate:.0f} tok/s | {clock(elapsed)}")
        return text[:WIDTH]


class _Silent(RolloutProgress):
    """What :func:`current_progress` is outside a :func:`step_progress` block: counts nothing."""

    def rollout_finished(self) -> None:
        pass

    def generated(self, tokens: int) -> None:
        pass

    def finished_elsewhere(self, rollouts: int, tokens: int) -> None:
        pass

    def tool_started(self) -> None:
        pass

    def tool_ended(self) -> None:
        pass


_SILENT = _Silent(0)
_CURRENT: RolloutProgress = _SILENT


def current_progress() -> RolloutProgress:
    """The active phase's counters (a no-op object when none is active)."""
    return _CURRENT


class _Printer:
    """The thread printing the status line (terminal) or the heartbeat (anything else)."""

    def __init__(self, progress: RolloutProgress, stream: IO[str], live: bool, heartbeat_s: float) -> None:
        self.progress, self.stream, self.live = progress, stream, live
        self.period = LIVE_PERIOD_S if live else heartbeat_s
        self.stop = threading.Event()
        self.drawn = False
        self.thread = threading.Thread(target=self._loop, name="tracerl-progress", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.period):
            line = self.progress.line()
            try:
                if self.live:
                    self.stream.write("\r" + line.ljust(WIDTH))
                    self.drawn = True
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: progress is not worth a crash
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        if self.drawn:
            try:
                self.stream.write("\r" + " " * WIDTH + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass


@contextmanager
def step_progress(planned: int, stream: IO[str] | None = None, live: bool | None = None,
                  heartbeat_s: float = HEARTBEAT_S, show: bool = True) -> Iterator[RolloutProgress]:
    """Report the rollout phase inside the block (``planned`` rollouts) on ``stream`` (stdout):
    a live line when it is a terminal (``live`` overrides), else a heartbeat every ``heartbeat_s``;
    ``show=False`` only counts (a trainer without a console: tests, ``quiet=True``)."""
    global _CURRENT
    out = stream if stream is not None else sys.stdout
    if live is None:
        live = bool(getattr(out, "isatty", lambda: False)())
    progress = RolloutProgress(planned)
    printer = _Printer(progress, out, live, heartbeat_s) if show else None
    previous, _CURRENT = _CURRENT, progress
    if printer is not None:
        printer.thread.start()
    try:
        yield progress
    finally:
        _CURRENT = previous
        if printer is not None:
            printer.close()
