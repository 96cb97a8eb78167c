"""The agent-format interface: :class:`AgentFormat`, which every format subclasses.

Also what formats in more than one module use: :func:`encode_prompt` (BOS then the text) and the
check that turns a parsed tool call into an :class:`~tracerl.core.types.Action` (an invalid one
when the tool or its arguments are wrong). It sits below every format module:
:mod:`tracerl.agent.formats` (``react``, the built-in Qwen3 markup and the registry that builds
every format; it re-exports these), :mod:`tracerl.agent.chat_template` and
:mod:`tracerl.agent.search_r1`. So the registry imports the formats it builds, and none of them
imports the registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolCallError, ToolSet


class AgentFormat(ABC):
    """Text layout of one agent episode."""

    name: str = ""
    stop_strings: tuple[str, ...] = ()
    answer_opener: str = ""

    def prompt_ids(self, task: Task, tools: ToolSet, tokenizer: Any) -> list[int]:
        """Token ids of S_0: BOS (when the tokenizer has one) then the rendered prompt."""
        return encode_prompt(tokenizer, self.render_prompt(task, tools))

    def observation_ids(self, obs: Observation, sampled_ids: Sequence[int], tokenizer: Any) -> list[int]:
        """Forced ids after an assistant turn that sampled ``sampled_ids`` (text formats ignore them)."""
        return list(tokenizer.encode(self.render_observation(obs), add_special_tokens=False))

    def turn_stops(self, tools: ToolSet | None) -> tuple[str, ...]:
        """Strings on which a backend stops sampling a turn (``stop_strings``; a format whose
        actions depend on the tools adds theirs). A stop is only a candidate end: see :meth:`ends_turn`."""
        return tuple(self.stop_strings)

    def ends_turn(self, text: str) -> bool:
        """Whether a turn that stopped on one of :meth:`turn_stops` with ``text`` is complete.

        ``text`` is the turn's sampled text so far, special tokens kept. False makes the engine
        sample on within the same turn (e.g. the stop fell inside the reasoning, not after the
        action). The base format ends the turn on every stop.
        """
        return True

    @abstractmethod
    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        """The prompt S_0 (ends where the first assistant turn starts)."""

    @abstractmethod
    def parse(self, text: str, tools: ToolSet) -> Action:
        """The action in one assistant turn; never raises."""

    @abstractmethod
    def render_observation(self, obs: Observation) -> str:
        """Forced text after an assistant turn, up to where the next assistant turn starts."""

    @abstractmethod
    def render_action(self, action: Action, thought: str = "") -> str:
        """The assistant text that expresses ``action`` (ends with the stop string if any)."""

    def render_episode(self, task: Task, tools: ToolSet,
                       steps: Sequence[tuple[Action, Observation]], thoughts: Sequence[str] = ()) -> str:
        """A whole episode as text (for pretraining data and debugging)."""
        parts = [self.render_prompt(task, tools)]
        for i, (action, obs) in enumerate(steps):
            parts.append(self.render_action(action, thoughts[i] if i < len(thoughts) else ""))
            parts.append(self.render_observation(obs))
        return "".join(parts)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Prompt token ids: the BOS token (when the tokenizer has one) then the text, no EOS.

    Continuations (observations, answers) are encoded with ``add_special_tokens=False``;
    pretraining builds its episodes the same way so the policy sees familiar prefixes.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([int(bos)] if bos is not None else []) + list(ids)


def _tool_action(name: str, arguments: dict[str, Any], tools: ToolSet) -> Action:
    """A tool action, or invalid when the tool or its arguments are wrong.

    An invalid action keeps only its scalar arguments: nested JSON can be deep enough to break
    anything that walks it later (``dataclasses.asdict`` for the evaluation records).
    """
    if name not in tools:
        return Action(kind="invalid", name=name, error=f"unknown action {name}")
    try:
        tools[name].check(arguments)
    except ToolCallError as exc:
        scalars = {k: v for k, v in arguments.items() if v is None or isinstance(v, (str, int, float, bool))}
        return Action(kind="invalid", name=name, arguments=scalars, error=str(exc))
    return Action(kind="tool", name=name, arguments=arguments)


def _why(text: str) -> str:
    return text.strip().rstrip(".")
