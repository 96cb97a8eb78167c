"""Tool health: count tool calls and infrastructure failures, stop a run whose tools are down.

A failing tool only marks its trajectory ``infra_failed`` (left out of the loss), so a run
whose search backend is dead would go on "training" on nothing and exit 0. The trainer
reads each step's counts (:meth:`ToolStats.take`) and feeds them to :class:`ToolHealth`,
which raises :class:`ToolHealthError` once every call of ``max_failed_steps`` consecutive
steps failed. A step without tool calls (every rollout answered at once) says nothing about
the tools and leaves the streak as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracerl.errors import UserError


class ToolHealthError(UserError):
    """Every tool call of several consecutive steps failed; the run stops (checkpoints intact)."""


@dataclass
class ToolStats:
    """Tool calls that reached a tool, and those that failed (exception, exit, timeout)."""

    calls: int = 0
    failures: int = 0
    last_failure: str = ""
    """Message of the most recent failure (named when the run stops)."""

    def record(self, failure: str | None = None) -> None:
        """Count one call; ``failure`` is its message when it was an infrastructure failure."""
        self.calls += 1
        if failure is not None:
            self.failures += 1
            self.last_failure = failure

    def take(self) -> ToolStats:
        """The counts so far, resetting them (call once per training step)."""
        out = ToolStats(self.calls, self.failures, self.last_failure)
        self.calls, self.failures, self.last_failure = 0, 0, ""
        return out

    def __add__(self, other: ToolStats) -> ToolStats:
        return ToolStats(self.calls + other.calls, self.failures + other.failures,
                         other.last_failure or self.last_failure)


def failed_streak(streak: int, calls: int, failures: int) -> int:
    """The streak of all-failed steps after a step with ``calls`` calls and ``failures`` failures.

    All calls failed: ``streak + 1``; some call succeeded: 0; no call at all: unchanged.
    """
    if calls < 0 or not 0 <= failures <= calls:
        raise ValueError(f"need 0 <= failures <= calls, got calls={calls}, failures={failures}")
    if calls == 0:
        return streak
    return streak + 1 if failures == calls else 0


class ToolHealth:
    """Stops a run after ``max_failed_steps`` consecutive steps in which every tool call failed."""

    def __init__(self, max_failed_steps: int) -> None:
        if max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be >= 1, got {max_failed_steps}")
        self.max_failed_steps = max_failed_steps
        self.streak = 0

    def observe(self, calls: int, failures: int, last_failure: str = "") -> None:
        """Account one step's tool calls; raise :class:`ToolHealthError` when the limit is reached."""
        self.streak = failed_streak(self.streak, calls, failures)
        if self.streak >= self.max_failed_steps:
            last = f"; last failure: {last_failure}" if last_failure else ""
            raise ToolHealthError(
                f"every tool call failed in {self.streak} consecutive steps ({failures} of {calls} in the last"
                f"{last}); fix the tools or data (limit: data.max_failed_tool_steps = {self.max_failed_steps}); "
                "the last checkpoint is intact")
