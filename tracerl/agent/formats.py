"""Agent formats: how prompts, actions and observations look as text, and how to parse actions.

A format fixes the stop strings that end an assistant turn, how observations are rendered and
the *answer opener* ``A`` after which the frozen reference scores the gold answer (spec
section 2 step 1: ``l_k`` is scored on ``S_k + A``). Parsing never raises: anything the policy
writes becomes an :class:`Action`, and malformed output becomes ``Action(kind="invalid")``
whose error the environment turns into an observation listing the valid actions.

Formats are registered by name in :data:`FORMATS` (``react``, ``chat``, ``search_r1``); ``model.format``
may also be an import path ``package.module:factory``.

Every format subclasses :class:`AgentFormat` (:mod:`tracerl.agent.base`, with :func:`encode_prompt`);
the ``<tool_call>``/``<answer>`` markup both ``chat`` formats use (:func:`parse_tagged`,
:func:`render_tagged_action`, :data:`DEFAULT_SYSTEM`, ...) is in :mod:`tracerl.agent.tagged`. Both
are re-exported here.

``react`` is plain text for small word-level models. ``chat`` writes ``<tool_call>`` JSON and a
final ``<answer>``; its markup comes from the tokenizer's own chat template when it has one
(:class:`~tracerl.agent.chat_template.ChatTemplateFormat`, token-exact per turn), else from the
built-in Qwen3 markup (:class:`Qwen3MarkupFormat`, e.g. the embedded word-level tokenizer).

Token level: the engine asks a format for ``prompt_ids`` and, after each sampled turn, for the
forced ``observation_ids``; text formats encode their rendered text, template formats build ids
turn by turn (never re-tokenising the whole history).

Ending a turn: a backend stops sampling on any of :meth:`AgentFormat.turn_stops` (plain
substrings, all a vLLM engine can match); the engine then asks :meth:`AgentFormat.ends_turn`
whether the text really completes the turn, and when it does not (a ``]`` inside a react
thought, a ``</tool_call>`` inside an open think block) samples on within the same turn. So a
turn ends as soon as its action is written (react: the ``]`` closing ``Action: name[``; chat:
``</tool_call>``/``</answer>``; Search-R1: ``</search>``, ``</answer>`` or another tool's closing
tag) instead of running on to the token cap. The token that completes the action is kept as
sampled, with any text it carries past the stop; parsers ignore that tail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.agent.base import AgentFormat, _tool_action, _why, encode_prompt  # noqa: F401 - encode_prompt re-exported
from tracerl.agent.chat_template import ChatTemplateFormat, has_usable_template
from tracerl.agent.tagged import (
    DEFAULT_SYSTEM,
    TOOL_CALL_HELP,
    error_text,
    parse_tagged,
    render_tagged_action,
    tool_listing,
)
from tracerl.agent.turn_end import OBSERVATION_MARK, action_end, tagged_ends_turn, unwritten_mark
from tracerl.core.registry import Registry
from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet


class ReactFormat(AgentFormat):
    """``Action: search[query]`` / ``Observation: ...`` / ``Action: answer[text]``.

    A turn ends at the ``]`` that closes its first ``Action: name[`` (or at a newline inside that
    argument, a malformed action), or at ``Observation:`` for a turn without an action; a ``]``
    in the thought before the action does not end it. The forced text after a tool turn starts
    with whatever of ``"\nObservation:"`` the policy did not write, so episodes read as in
    :meth:`render_episode` whichever way the turn ended.
    """

    name = "react"
    stop_strings = ("]", "Observation:")
    answer_opener = "Action: answer["
    _ACTION = re.compile(r"Action:[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\[")

    def __init__(self, tool_list: bool = False, system: str = "", tokenizer: Any = None) -> None:
        self.tool_list = tool_list
        """Whether the prompt starts with a one-line list of the actions."""
        self.system = system
        """A first prompt line (none by default; ``tokenizer`` is accepted for a uniform factory)."""

    def _signatures(self, tools: ToolSet) -> list[str]:
        return [f"{n}[{t.parameters[0].name if t.parameters else ''}]" for n, t in tools.items()]

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        head = ""
        if self.tool_list:
            head = "Actions: " + " ".join(self._signatures(tools) + ["answer[text]"]) + "\n"
        system = f"{self.system}\n" if self.system else ""
        return f"{system}{head}Question: {task.question}\n"

    def parse(self, text: str, tools: ToolSet) -> Action:
        match = self._ACTION.search(text)
        if match is None:
            return Action(kind="invalid", error="no action found")
        name = match.group(1)
        end = action_end(text, match.end())
        if end is None or not end[1] or "Observation:" in text[match.end(): end[0]]:
            return Action(kind="invalid", name=name, error="missing ] after the argument")
        arg = text[match.end(): end[0]].strip()  # the tail after the closing ] is ignored
        if name == "answer":
            if not arg:
                return Action(kind="invalid", name=name, error="empty answer")
            return Action(kind="answer", answer=arg)
        if name not in tools:
            return Action(kind="invalid", name=name, error=f"unknown action {name}")
        params = tools[name].parameters
        if not params:
            return _tool_action(name, {}, tools) if not arg else Action(
                kind="invalid", name=name, error=f"{name} takes no argument")
        if not arg:
            return Action(kind="invalid", name=name, error=f"empty {params[0].name}")
        return _tool_action(name, {params[0].name: arg}, tools)

    def ends_turn(self, text: str) -> bool:
        """Complete once the first action is closed (or broken by a newline), or at ``Observation:``."""
        if "Observation:" in text:
            return True
        match = self._ACTION.search(text)
        return match is not None and action_end(text, match.end()) is not None

    def observation_ids(self, obs: Observation, sampled_ids: Sequence[int], tokenizer: Any) -> list[int]:
        """``"\nObservation:"`` minus what the turn wrote of it, then :meth:`render_observation`."""
        text = self.render_observation(obs)
        if not text:
            return []
        written = tokenizer.decode(list(sampled_ids), skip_special_tokens=True)
        return list(tokenizer.encode(unwritten_mark(written, OBSERVATION_MARK) + text, add_special_tokens=False))

    def render_observation(self, obs: Observation) -> str:
        if obs.error:
            valid = ", ".join([f"{n}[{p}]" for n, p in obs.valid_actions] + ["answer[text]"])
            tail = f" Valid actions: {valid}." if obs.valid_actions else ""
            return f" Error: {_why(obs.text)}.{tail}\n"
        if obs.done and not obs.text:
            return ""
        return f" {obs.text}\n"

    def render_action(self, action: Action, thought: str = "") -> str:
        head = f"Thought: {thought}\n" if thought else ""
        if action.kind == "answer":
            return f"{head}Action: answer[{action.answer}]"
        if action.kind == "tool":
            arg = next(iter(action.arguments.values()), "")
            return f"{head}Action: {action.name}[{arg}]\nObservation:"
        raise ValueError(f"cannot render an action of kind {action.kind!r}")


class Qwen3MarkupFormat(AgentFormat):
    """The built-in Qwen3 markup (``chat`` when the tokenizer has no usable chat template).

    ``<tool_call>`` JSON, ``<tool_response>`` user turns, ``<answer>``; written by hand so word-level
    tokenizers without a template (the embedded tiny model) can run the chat format.
    """

    name = "chat"
    stop_strings = ("</tool_call>", "</answer>", "<|im_end|>")
    answer_opener = "<answer>"

    def __init__(self, system: str = "", thinking: bool = True, tokenizer: Any = None, tool_list: bool = True) -> None:
        self.system = system or DEFAULT_SYSTEM
        self.thinking = thinking
        """False opens every assistant turn with an empty think block (Qwen3 no-think mode)."""
        self.tool_list = tool_list
        """Whether the system turn lists the tool schemas (``# Tools`` section)."""

    def _assistant_open(self) -> str:
        return "<|im_start|>assistant\n" + ("" if self.thinking else "<think>\n\n</think>\n\n")

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        system = self.system
        if self.tool_list:
            system += (f"\n\n# Tools\n\nYou can call these functions; their signatures are inside "
                       f"<tools></tools>:\n<tools>\n{tool_listing(tools)}\n</tools>\n\n{TOOL_CALL_HELP}")
        return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{task.question}<|im_end|>\n"
                + self._assistant_open())

    def parse(self, text: str, tools: ToolSet) -> Action:
        return parse_tagged(text, tools)

    def ends_turn(self, text: str) -> bool:
        return tagged_ends_turn(text, "<|im_end|>")

    def render_observation(self, obs: Observation) -> str:
        if obs.done and not obs.text and not obs.error:
            return ""
        body = error_text(obs) if obs.error else obs.text
        return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n"
                + self._assistant_open())

    def render_action(self, action: Action, thought: str = "") -> str:
        return render_tagged_action(action, thought, self.thinking)


ChatFormat = Qwen3MarkupFormat
"""Former name of the built-in markup format."""


def chat_format(tokenizer: Any = None, system: str = "", thinking: bool = True, tool_list: bool = True) -> AgentFormat:
    """``chat``: the tokenizer's chat template when it has a usable one, else the built-in Qwen3 markup.

    ``tool_list=False`` leaves the tool schemas out of the prompt (the system text then has to
    describe the tools)."""
    if tokenizer is not None and has_usable_template(tokenizer):
        return ChatTemplateFormat(tokenizer, system=system, thinking=thinking, tool_list=tool_list)
    return Qwen3MarkupFormat(system=system, thinking=thinking, tool_list=tool_list)


FormatFactory = Callable[..., AgentFormat]
FORMATS: Registry[FormatFactory] = Registry("agent format")
"""Format factories by name, called with ``tokenizer=``, ``system=`` and, when set, ``tool_list=``;
``get_format`` also resolves ``package.module:factory`` import paths (a class works: it is called)."""
FORMATS.add("react", ReactFormat)
FORMATS.add("chat", chat_format)
FORMATS.add_lazy("search_r1", "tracerl.agent.search_r1:SearchR1Format")


def get_format(name: str, **kwargs: Any) -> AgentFormat:
    """A format by name or import path (``tokenizer=``, ``system=``, ``tool_list=`` and format options
    as keywords; ``tool_list=None`` keeps the format's own default); unknown names list the valid ones."""
    if kwargs.get("tool_list", False) is None:
        kwargs = {k: v for k, v in kwargs.items() if k != "tool_list"}
    fmt = FORMATS.get(name)(**kwargs)
    if not isinstance(fmt, AgentFormat):
        raise ValueError(f"agent format {name!r} built a {type(fmt).__name__}, not an AgentFormat")
    return fmt
