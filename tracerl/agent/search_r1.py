"""``search_r1``: the Search-R1 agent format (Jin et al., 2025, "Search-R1: Training LLMs to
Reason and Leverage Search Engines with Reinforcement Learning").

The policy reasons inside ``<think> ... </think>``, searches with ``<search> query </search>``,
reads results the environment inserts as ``<information> ... </information>``, and ends with
``<answer> ... </answer>``. Generation stops on ``</search>``, ``</answer>`` and the closing tag
of any other one-argument tool, unless the tag sits inside a think block left open; the frozen
reference scores the gold answer after the opener ``<answer>``. The whole episode is one
assistant message: observations are forced text inside it, not new chat turns, as in Search-R1.

The prompt is Search-R1's instruction followed by the question. With a tokenizer that has a
usable chat template the prompt is that instruction as one user message through
``apply_chat_template(add_generation_prompt=True)`` (Search-R1 does the same for instruct
models); otherwise it is the plain text. Other single-argument tools (``open``, a custom
``lookup``) are called the same way, ``<open> title </open>``; with ``tool_list`` the prompt
names them (Search-R1 itself has only ``search``, so the list is off by default).
"""

from __future__ import annotations

import re
from typing import Any

from tracerl.agent.base import AgentFormat, _tool_action, _why, encode_prompt
from tracerl.agent.turn_end import tagged_ends_turn
from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet

INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without "
    "detailed illustrations. For example, <answer> Beijing </answer>."
)
"""Search-R1's instruction, word for word (its typo "as your want" included): models trained with
it, and prompts compared against it, expect exactly this text."""

_TAG = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")
_INVALID_HINT = ("My previous action is invalid. To search, put the query between <search> and </search>. "
                 "To give the final answer, put it between <answer> and </answer>. Let me try again.")


class SearchR1Format(AgentFormat):
    """``<think>`` / ``<search> q </search>`` / ``<information> .. </information>`` / ``<answer> a </answer>``."""

    name = "search_r1"
    stop_strings = ("</search>", "</answer>")
    answer_opener = "<answer>"

    def __init__(self, tokenizer: Any = None, system: str = "", tool_list: bool = False) -> None:
        self.instruction = system or INSTRUCTION
        """The instruction before ``Question:`` (``model.system_prompt`` replaces Search-R1's)."""
        self.tool_list = tool_list
        """Whether the prompt names every tool and its argument (off: Search-R1's prompt as is)."""
        self._template = None
        if tokenizer is not None:
            from tracerl.agent.chat_template import has_usable_template

            if has_usable_template(tokenizer):
                self._template = tokenizer

    def _tool_line(self, tools: ToolSet) -> str:
        calls = [f"<{n}> {t.parameters[0].name} </{n}> ({t.description.rstrip('.')})"
                 for n, t in tools.items() if len(t.parameters) == 1]
        return " Tools: " + "; ".join(calls) + "." if calls else ""

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        head = self.instruction + (self._tool_line(tools) if self.tool_list else "")
        text = f"{head} Question: {task.question}\n"
        if self._template is None:
            return text
        from tracerl.agent.template_sandbox import sandbox_for

        # a stranger's template renders in a killable child under time and size limits
        return sandbox_for(self._template).render([{"role": "user", "content": text}], add_generation_prompt=True)

    def prompt_ids(self, task: Task, tools: ToolSet, tokenizer: Any) -> list[int]:
        """A templated prompt carries its own special tokens (no BOS added); plain text gets BOS."""
        text = self.render_prompt(task, tools)
        if self._template is not None:
            return list(tokenizer.encode(text, add_special_tokens=False))
        return encode_prompt(tokenizer, text)

    def turn_stops(self, tools: ToolSet | None) -> tuple[str, ...]:
        """``</search>``, ``</answer>`` and the closing tag of every other one-argument tool, so a
        turn ends as soon as any action it can parse is closed (not only a search)."""
        closing = [f"</{n}>" for n, t in (tools or {}).items() if len(t.parameters) == 1]
        return tuple(dict.fromkeys(self.stop_strings + tuple(closing)))

    def ends_turn(self, text: str) -> bool:
        """A closing tag inside a think block left open does not end the turn (the parser skips it)."""
        return tagged_ends_turn(text)

    def parse(self, text: str, tools: ToolSet) -> Action:
        """The first ``<answer>`` or ``<tool>`` block after the reasoning; never raises.

        Text inside ``<think>`` is skipped (a model may quote ``<search>`` while reasoning). A block
        whose closing tag is missing runs to the end of the text: the stop string that ended the
        turn (``</search>``) may not be part of ``text``. Tags of unknown tools are skipped.
        """
        body = text.rsplit("</think>", 1)[1] if "</think>" in text else text
        if "<think>" in body:
            return Action(kind="invalid", error="the think block was never closed")
        for match in _TAG.finditer(body):
            name = match.group(1)
            if name != "answer" and name not in tools:
                continue
            content = body[match.end():].split(f"</{name}>", 1)[0].strip()
            if name == "answer":
                return Action(kind="answer", answer=content) if content else Action(
                    kind="invalid", name=name, error="empty answer")
            params = tools[name].parameters
            if len(params) != 1:
                return Action(kind="invalid", name=name, error=f"{name} takes {len(params)} arguments, not one")
            if not content:
                return Action(kind="invalid", name=name, error=f"empty {params[0].name}")
            return _tool_action(name, {params[0].name: content}, tools)
        return Action(kind="invalid", error="no <search> or <answer> found")

    def render_observation(self, obs: Observation) -> str:
        if obs.done and not obs.text and not obs.error:
            return ""
        if obs.error:
            return f"\n{_why(obs.text)}. {_INVALID_HINT}\n"
        return f"\n\n<information>{obs.text.strip()}</information>\n\n"

    def render_action(self, action: Action, thought: str = "") -> str:
        head = f"<think> {thought} </think>\n" if thought else ""
        if action.kind == "answer":
            return f"{head}<answer> {action.answer} </answer>"
        if action.kind == "tool":
            arg = next(iter(action.arguments.values()), "")
            return f"{head}<{action.name}> {arg} </{action.name}>"
        raise ValueError(f"cannot render an action of kind {action.kind!r}")
