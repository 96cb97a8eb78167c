"""The environment protocol: start an episode for a task, apply parsed actions, get observations.

An episode is a small value object (task, turn counter, history) so the rollout engine can
``clone()`` it at any stored boundary and let a branch continue from there (spec section 3,
stage 2: continuations resume from the stored prefix).

Who is at fault decides the flags: a malformed or wrong call is the policy's fault
(``error=True``, the episode goes on and the turn counts); an exception or timeout inside a
tool is the environment's (``infra_failed=True``, the episode ends and the trajectory is left
out of group statistics and the loss, spec section 2 step 6). A tool calling ``sys.exit`` is
such a failure too, and so is any other ``BaseException`` subclass a tool raises;
``KeyboardInterrupt`` propagates (see envs/tools.py). Every call that
reaches a tool is counted, per tool, in the environment's :class:`ToolStats` for the run's tool health.

What cannot be caught in-process: ``os._exit`` (or a crash of native code) in an *in-process* tool
ends the trainer, as it would any Python program. In-process tools are trusted code (the built-in
bm25s ``search``/``open``); a plug-in tool runs isolated by default (``data.isolate_tools``), where
``os._exit`` only ends its worker process and the call is an infrastructure failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tracerl.core.types import Action, Task
from tracerl.envs.health import ToolStats
from tracerl.envs.tool_errors import bounded_message
from tracerl.envs.tools import CHARS_PER_TOKEN, ToolCallError, ToolFailure, ToolSet, truncate_words


DEFAULT_MAX_TURNS = 8
"""Assistant turns per episode (the default of every engine and environment)."""
DEFAULT_MAX_OBSERVATION_TOKENS = 256
"""Forced tokens of the policy's tokenizer after one assistant turn (the default everywhere)."""


@dataclass(frozen=True)
class EnvConfig:
    """Episode limits as the environment applies them.

    The limits are defined once, by the rollout engine's config (``EngineConfig``), and an
    environment gets them through :func:`env_config`; the defaults here are
    the same constants. The unit of ``max_observation_tokens`` is tokens of the policy's
    tokenizer, which only the engine knows: it cuts the rendered observation to that many
    tokens. The environment pre-cuts a tool result to that many whitespace words, which never
    removes text the token cut keeps (every word is at least one token) and bounds the work,
    after cutting it to ``max_observation_tokens * CHARS_PER_TOKEN`` (64) characters so that a
    10 MB result without spaces costs nothing either; a failure's message is cut to
    ``MAX_FAILURE_CHARS`` (1,000) characters (envs/tools.py).
    """

    max_turns: int = DEFAULT_MAX_TURNS
    """Turns (tool calls, invalid outputs and the answer) before the episode is cut off."""
    max_observation_tokens: int = DEFAULT_MAX_OBSERVATION_TOKENS
    """Observation limit in policy tokens (applied here as a word pre-cut; see above)."""
    tool_timeout_s: float | None = None
    """Seconds a tool may run before the call is an infrastructure failure (None: no limit)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"EnvConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.max_observation_tokens < 1:
            raise ValueError(f"EnvConfig.max_observation_tokens must be >= 1, got {self.max_observation_tokens}")
        if self.tool_timeout_s is not None and self.tool_timeout_s <= 0:
            raise ValueError(f"EnvConfig.tool_timeout_s must be > 0 or None, got {self.tool_timeout_s}")


class EpisodeLimits(Protocol):
    """Anything holding the two episode limits (``EngineConfig``, the one place they are set)."""

    max_turns: int
    max_observation_tokens: int


def env_config(limits: EpisodeLimits, tool_timeout_s: float | None = None) -> EnvConfig:
    """The environment config of ``limits`` (the one place an environment's limits are derived)."""
    return EnvConfig(max_turns=limits.max_turns, max_observation_tokens=limits.max_observation_tokens,
                     tool_timeout_s=tool_timeout_s)


@dataclass(frozen=True)
class Observation:
    """What the environment returns for one action."""

    text: str
    done: bool
    error: bool
    infra_failed: bool = False
    valid_actions: tuple[tuple[str, str], ...] = ()
    """On errors: (tool name, first parameter name) of each tool, so a format can list them."""


class Episode(Protocol):
    turns_taken: int

    def step(self, action: Action) -> Observation: ...

    def clone(self) -> Episode: ...

    # Optional: ``restore(steps)`` replays recorded (action, observation) pairs without calling
    # tools; episodes without it cannot be adopted by another executor (see RolloutEngine.adopt).


class Environment(Protocol):
    def start(self, task: Task) -> Episode: ...


@dataclass
class ToolEpisode:
    """One task's episode over a :class:`ToolSet`."""

    task: Task
    tools: ToolSet
    config: EnvConfig
    turns_taken: int = 0
    done: bool = False
    answer: str | None = None
    infra_failed: bool = False
    history: list[tuple[Action, Observation]] = field(default_factory=list)
    stats: ToolStats = field(default_factory=ToolStats)
    """The environment's call counters (shared by every episode and clone of it)."""

    def clone(self) -> ToolEpisode:
        """An independent copy sharing the (stateless) tools and the stats; history copied."""
        return ToolEpisode(self.task, self.tools, self.config, self.turns_taken, self.done,
                           self.answer, self.infra_failed, list(self.history), stats=self.stats)

    def restore(self, steps: Sequence[tuple[Action, Observation]]) -> None:
        """Replay recorded ``(action, observation)`` steps without calling any tool (and without
        counting calls): an executor adopting a tree rebuilds the episode at each of its boundaries."""
        for action, obs in steps:
            if self.done:
                raise ValueError(f"episode for task {self.task.id!r} is already finished; cannot restore more steps")
            self.turns_taken += 1
            if action.kind == "answer":
                self.answer = action.answer
            self.infra_failed = self.infra_failed or obs.infra_failed
            self.done = obs.done or action.kind == "answer"
            self.history.append((action, obs))

    def _valid_actions(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, t.parameters[0].name if t.parameters else "") for name, t in self.tools.items())

    def _run(self, action: Action) -> str:
        max_chars = self.config.max_observation_tokens * CHARS_PER_TOKEN  # bounds a 10 MB result
        return self.tools.call(action.name, action.arguments, self.config.tool_timeout_s, max_chars)

    def step(self, action: Action) -> Observation:
        if self.done:
            raise ValueError(f"episode for task {self.task.id!r} is already finished")
        self.turns_taken += 1
        if action.kind == "answer":
            self.done, self.answer = True, action.answer
            obs = Observation("", done=True, error=False)
        elif action.kind == "invalid":
            obs = self._policy_error(action.error or "invalid action")
        else:
            obs = self._call(action)
        self.done = obs.done
        self.history.append((action, obs))
        return obs

    def _call(self, action: Action) -> Observation:
        """One tool call's observation: its text, the policy's error, or an infrastructure failure."""
        try:
            text = truncate_words(self._run(action), self.config.max_observation_tokens)
        except ToolCallError as exc:  # rejected before the tool ran: not a tool call
            return self._policy_error(str(exc))
        except ToolFailure as exc:
            return self._infra_failure(action.name, str(exc))
        except KeyboardInterrupt:  # the user's Ctrl-C
            raise
        except BaseException as exc:  # noqa: BLE001 - a tool's own BaseException subclass is its failure
            return self._infra_failure(action.name, f"tool {action.name} raised {type(exc).__name__}: "
                                                    f"{bounded_message(_message(exc))}")
        self.stats.record(action.name)
        return Observation(text, done=self._out_of_turns(), error=False)

    def _infra_failure(self, name: str, why: str) -> Observation:
        self.infra_failed = True
        self.stats.record(name, failure=why)
        return Observation(why, done=True, error=True, infra_failed=True)

    def _out_of_turns(self) -> bool:
        return self.turns_taken >= self.config.max_turns

    def _policy_error(self, why: str) -> Observation:
        return Observation(why, done=self._out_of_turns(), error=True, valid_actions=self._valid_actions())


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return "<message cannot be printed>"


class ToolEnvironment:
    """An :class:`Environment` whose actions are calls into a :class:`ToolSet`."""

    def __init__(self, tools: ToolSet, config: EnvConfig | None = None) -> None:
        self.tools = tools
        self.config = config or EnvConfig()
        self.stats = ToolStats()
        """Calls and infrastructure failures of every episode started here."""

    def start(self, task: Task) -> ToolEpisode:
        return ToolEpisode(task=task, tools=self.tools, config=self.config, stats=self.stats)

    def take_tool_stats(self) -> ToolStats:
        """Tool calls and failures since the last take (resets them)."""
        return self.stats.take()
