"""Agent formats: how prompts, actions and observations look as text, and how to parse actions.

A format fixes the stop strings that end an assistant turn, how observations are rendered and
the *answer opener* ``A`` after which the frozen reference scores the gold answer (spec
section 2 step 1: ``l_k`` is scored on ``S_k + A``). Parsing never raises: anything the policy
writes becomes an :class:`Action`, and malformed output becomes ``Action(kind="invalid")``
whose error the environment turns into an observation listing the valid actions.

``react`` is plain text for small word-level models; ``chat`` is the Qwen3-style chat template
with ``<tool_call>`` JSON, ``<tool_response>`` turns and a final ``<answer>``.
"""

from __future__ import annotations

import json
import re
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


def _tool_action(name: str, arguments: dict[str, Any], tools: ToolSet) -> Action:
    """A tool action, or invalid when the tool or its arguments are wrong."""
    if name not in tools:
        return Action(kind="invalid", name=name, error=f"unknown action {name}")
    try:
        tools[name].check(arguments)
    except ToolCallError as exc:
        return Action(kind="invalid", name=name, arguments=arguments, error=str(exc))
    return Action(kind="tool", name=name, arguments=arguments)


def _why(text: str) -> str:
    return text.strip().rstrip(".")


class ReactFormat(AgentFormat):
    """``Action: search[query]`` / ``Observation: ...`` / ``Action: answer[text]``."""

    name = "react"
    stop_strings = ("Observation:",)
    answer_opener = "Action: answer["
    _ACTION = re.compile(r"Action:[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\[")

    def __init__(self, tool_list: bool = False) -> None:
        self.tool_list = tool_list
        """Whether the prompt starts with a one-line list of the actions."""

    def _signatures(self, tools: ToolSet) -> list[str]:
        return [f"{n}[{t.parameters[0].name if t.parameters else ''}]" for n, t in tools.items()]

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        head = ""
        if self.tool_list:
            head = "Actions: " + " ".join(self._signatures(tools) + ["answer[text]"]) + "\n"
        return f"{head}Question: {task.question}\n"

    def parse(self, text: str, tools: ToolSet) -> Action:
        match = self._ACTION.search(text)
        if match is None:
            return Action(kind="invalid", error="no action found")
        name = match.group(1)
        line = text[match.end():].split("\n", 1)[0].split("Observation:", 1)[0]
        if "]" not in line:
            return Action(kind="invalid", name=name, error="missing ] after the argument")
        arg = line[: line.rindex("]")].strip()
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


class ChatFormat(AgentFormat):
    """Qwen3-style chat template: ``<tool_call>`` JSON, ``<tool_response>`` user turns, ``<answer>``."""

    name = "chat"
    stop_strings = ("</tool_call>", "</answer>", "<|im_end|>")
    answer_opener = "<answer>"

    def __init__(self, system: str = "", thinking: bool = True) -> None:
        self.system = system or (
            "Answer the question by searching the document collection with the tools. "
            "When you know the answer, reply with the final answer inside <answer></answer>, "
            "as short as possible."
        )
        self.thinking = thinking
        """False opens every assistant turn with an empty think block (Qwen3 no-think mode)."""

    def _assistant_open(self) -> str:
        return "<|im_start|>assistant\n" + ("" if self.thinking else "<think>\n\n</think>\n\n")

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        listing = "\n".join(json.dumps({"type": "function", "function": s}) for s in tools.schemas())
        system = (
            f"{self.system}\n\n# Tools\n\nYou can call these functions; their signatures are inside "
            f"<tools></tools>:\n<tools>\n{listing}\n</tools>\n\nTo call a function, write a JSON object "
            'with its name and arguments inside <tool_call></tool_call>:\n<tool_call>\n'
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )
        return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{task.question}<|im_end|>\n"
                + self._assistant_open())

    def parse(self, text: str, tools: ToolSet) -> Action:
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        elif "<think>" in text:
            return Action(kind="invalid", error="the think block was never closed")
        call, ans = text.find("<tool_call>"), text.find("<answer>")
        if call < 0 and ans < 0:
            return Action(kind="invalid", error="no <tool_call> or <answer> found")
        if ans >= 0 and (call < 0 or ans < call):
            body = text[ans + len("<answer>"):].split("</answer>", 1)[0].split("<|im_end|>", 1)[0].strip()
            return Action(kind="answer", answer=body) if body else Action(kind="invalid", error="empty answer")
        body = text[call + len("<tool_call>"):].split("</tool_call>", 1)[0].split("<|im_end|>", 1)[0]
        try:
            payload = json.loads(body.strip())
        except (json.JSONDecodeError, RecursionError):
            return Action(kind="invalid", error="the tool call is not valid JSON")
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return Action(kind="invalid", error='the tool call needs a "name" string')
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models double-encode the arguments
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                pass
        if not isinstance(arguments, dict):
            return Action(kind="invalid", name=payload["name"], error='"arguments" must be a JSON object')
        return _tool_action(payload["name"], arguments, tools)

    def render_observation(self, obs: Observation) -> str:
        if obs.done and not obs.text and not obs.error:
            return ""
        body = obs.text
        if obs.error:
            names = ", ".join(n for n, _ in obs.valid_actions)
            tail = f" Call one of the tools ({names}) or give the final answer in <answer></answer>." if names else ""
            body = f"Error: {_why(obs.text)}.{tail}"
        return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n"
                + self._assistant_open())

    def render_action(self, action: Action, thought: str = "") -> str:
        head = f"<think>\n{thought}\n</think>\n\n" if thought and self.thinking else ""
        if action.kind == "answer":
            return f"{head}<answer>{action.answer}</answer>"
        if action.kind == "tool":
            call = json.dumps({"name": action.name, "arguments": action.arguments}, ensure_ascii=False)
            return f"{head}<tool_call>\n{call}\n</tool_call>"
        raise ValueError(f"cannot render an action of kind {action.kind!r}")


FORMATS: dict[str, type[AgentFormat]] = {"react": ReactFormat, "chat": ChatFormat}


def get_format(name: str, **kwargs: Any) -> AgentFormat:
    """A format by name; unknown names fail listing the valid ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown agent format {name!r}; valid: {', '.join(sorted(FORMATS))}")
    return FORMATS[name](**kwargs)
