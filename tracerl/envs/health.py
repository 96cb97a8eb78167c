"""Tool health: count tool calls and infrastructure failures per tool, stop a run whose tool is down.

A failing tool only marks its trajectory ``infra_failed`` (left out of the loss), so a run
whose search backend is dead would go on "training" on nothing and exit 0. The trainer
reads each step's counts (:meth:`ToolStats.take`) and feeds them to :class:`ToolHealth`,
which raises :class:`ToolHealthError` once every call *of one tool* failed in
``max_failed_steps`` consecutive steps in which that tool was called: a dead ``search`` stops
the run even while ``open`` works. A step in which a tool was not called says nothing about it
and leaves its streak as it is. The streaks are part of a checkpoint (:meth:`ToolHealth.state_dict`),
so a resumed run stops at the same step as an uninterrupted one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tracerl.errors import UserError


_COUNTING = threading.Lock()  # episodes of one environment step concurrently (rollout/tool_calls.py)


class ToolHealthError(UserError):
    """One tool failed every call in several consecutive steps; the run stops (train/run.py's
    :func:`~tracerl.train.run.truthful_stop` adds which checkpoint a resume continues from)."""


@dataclass
class ToolStats:
    """Per tool: calls that reached it and those that failed (exception, exit, timeout, dead worker).

    JSON-typed fields, so ``ToolStats(**dataclasses.asdict(stats))`` round-trips and the counts
    can cross a process boundary or sit in a checkpoint as they are.
    """

    per_tool: dict[str, list[int]] = field(default_factory=dict)
    """``{tool name: [calls, failures]}``."""
    last_failure: dict[str, str] = field(default_factory=dict)
    """``{tool name: message of its most recent failure}`` (named when the run stops)."""

    @property
    def calls(self) -> int:
        """Calls of every tool."""
        return sum(c for c, _ in self.per_tool.values())

    @property
    def failures(self) -> int:
        """Failed calls of every tool."""
        return sum(f for _, f in self.per_tool.values())

    def record(self, tool: str, failure: str | None = None) -> None:
        """Count one call of ``tool``; ``failure`` is its message when it was an infrastructure failure."""
        with _COUNTING:
            counts = self.per_tool.setdefault(tool, [0, 0])
            counts[0] += 1
            if failure is not None:
                counts[1] += 1
                self.last_failure[tool] = failure

    def take(self) -> ToolStats:
        """The counts so far, resetting them (call once per training step)."""
        with _COUNTING:
            out = ToolStats(self.per_tool, self.last_failure)
            self.per_tool, self.last_failure = {}, {}
        return out

    def __add__(self, other: ToolStats) -> ToolStats:
        names = list(dict.fromkeys([*self.per_tool, *other.per_tool]))
        per_tool = {n: [a + b for a, b in zip(self.per_tool.get(n, [0, 0]), other.per_tool.get(n, [0, 0]), strict=True)]
                    for n in names}
        return ToolStats(per_tool, {**self.last_failure, **other.last_failure})


def failed_streak(streak: int, calls: int, failures: int) -> int:
    """One tool's streak of all-failed steps after a step with ``calls`` calls and ``failures`` failures.

    All calls failed: ``streak + 1``; some call succeeded: 0; no call at all: unchanged.
    """
    if calls < 0 or not 0 <= failures <= calls:
        raise ValueError(f"need 0 <= failures <= calls, got calls={calls}, failures={failures}")
    if calls == 0:
        return streak
    return streak + 1 if failures == calls else 0


class ToolHealth:
    """Stops a run after ``max_failed_steps`` consecutive steps in which every call of one tool failed."""

    def __init__(self, max_failed_steps: int) -> None:
        if max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be >= 1, got {max_failed_steps}")
        self.max_failed_steps = max_failed_steps
        self.streaks: dict[str, int] = {}
        """``{tool name: consecutive steps in which every call of it failed}``."""

    def observe(self, stats: ToolStats) -> None:
        """Account one step's tool calls; raise :class:`ToolHealthError` naming the first tool at the limit."""
        for name, (calls, failures) in stats.per_tool.items():
            self.streaks[name] = failed_streak(self.streaks.get(name, 0), calls, failures)
        for name, (calls, failures) in stats.per_tool.items():
            streak = self.streaks[name]
            if streak >= self.max_failed_steps:
                last = stats.last_failure.get(name, "")
                last = f"; last failure: {last}" if last else ""
                raise ToolHealthError(
                    f"tool {name!r} failed every call in {streak} consecutive steps ({failures} of {calls} in the "
                    f"last{last}); fix the tool or its backend (limit: data.max_failed_tool_steps = "
                    f"{self.max_failed_steps})")  # the trainer adds where a resume continues from

    def state_dict(self) -> dict[str, int]:
        """The per-tool streaks (what a checkpoint keeps)."""
        return dict(self.streaks)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.streaks = {str(k): int(v) for k, v in state.items()}


# --- data health: can the tools reach the answers at all? ----------------------------------------

MIN_REACHABILITY = 0.5
"""Default floor on env-check's ``answer_reachability`` (``--min-reachability``, ``data.min_reachability``).

A task file paired with its own corpus reaches most answers (converted HotpotQA and MuSiQue
samples: 0.9 and above); a task file over another dataset's corpus reaches a few percent
(HotpotQA over MuSiQue: 0.035). Half sits far from both."""


class ReachabilityError(UserError):
    """The oracle found the gold answer in too few tasks' evidence: the corpus does not hold it."""


def check_reachability(reachability: float, minimum: float, tasks: int, where: str, switch: str) -> None:
    """Raise :class:`ReachabilityError` (one line) when ``reachability < minimum``; ``minimum = 0`` is off.

    ``tasks``: how many tasks the share was measured on; ``where``: the task and corpus files;
    ``switch``: how the user lowers or disables the floor (a flag or a config field).
    """
    if not 0.0 <= minimum <= 1.0:
        raise ValueError(f"the reachability floor must be in [0, 1] (0: off), got {minimum}")
    if reachability < minimum:
        raise ReachabilityError(
            f"answer_reachability {reachability:.3f} is below {minimum:g} on {tasks} tasks ({switch}): the oracle "
            f"found few gold answers in the documents the tasks cite, so this corpus does not fit them ({where})")
