"""Agent formats: how prompts, actions and observations look as text, and how to parse actions.

A format fixes the stop strings that end an assistant turn, how observations are rendered and
the *answer opener* ``A`` after which the frozen reference scores the gold answer (spec
section 2 step 1: ``l_k`` is scored on ``S_k + A``). Parsing never raises: anything the policy
writes becomes an :class:`Action`, and malformed output becomes ``Action(kind="invalid")``
whose error the environment turns into an observation listing the valid actions.

Formats are registered by name in :data:`FORMATS` (``react``, ``chat``, ``search_r1``); ``model.format``
may also be an import path ``package.module:factory``.

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

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.agent.turn_end import OBSERVATION_MARK, action_end, tagged_ends_turn, unwritten_mark
from tracerl.agent.turn_end import strip_think as _strip_think
from tracerl.core.registry import Registry
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


DEFAULT_SYSTEM = (
    "Answer the question by searching the document collection with the tools. "
    "When you know the answer, reply with the final answer inside <answer></answer>, "
    "as short as possible."
)
TOOL_CALL_HELP = (
    'To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call>:\n'
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tool_listing(tools: ToolSet) -> str:
    """The tools as one JSON schema per line (the Qwen3 template's layout)."""
    return "\n".join(json.dumps({"type": "function", "function": s}) for s in tools.schemas())


def _load_json(text: str) -> tuple[bool, Any]:
    """``(ok, value)``; any malformed input is ``(False, None)``, never an exception.

    ValueError covers JSONDecodeError and integers past Python's digit limit (4,300 by
    default); RecursionError deep nesting. A ``\\ud800``-style escape decodes to a lone
    surrogate, which no tokenizer and no UTF-8 file accepts (the engine would fail rendering
    the observation that echoes it): such characters become ``?``.
    """
    try:
        value = json.loads(text)
        if "\\u" in text:
            value = json.loads(json.dumps(value, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))
        return True, value
    except (ValueError, RecursionError):
        return False, None


def _call_payload(text: str, call: int) -> tuple[bool, Any]:
    """The JSON object of a tool call: inside ``<tool_call>`` tags, or bare (Llama/Mistral style)."""
    if call >= 0:
        body = text[call + len("<tool_call>"):].split("</tool_call>", 1)[0]
        return _load_json(body.split("<|im_end|>", 1)[0].strip())
    ok, payload = _load_json(text[text.find("{"): text.rfind("}") + 1])
    if not ok:  # a JSON list of calls, e.g. after Mistral's [TOOL_CALLS]
        ok, payload = _load_json(text[text.find("["): text.rfind("]") + 1])
        payload = payload[0] if ok and isinstance(payload, list) and payload else payload
    return ok, payload


def parse_tagged(text: str, tools: ToolSet) -> Action:
    """Parse ``<tool_call>{json}</tool_call>`` or ``<answer>...</answer>``; never raises.

    A bare JSON object with ``name`` and ``arguments`` (or Llama's ``parameters``) also counts as
    a tool call, so models whose templates teach another call syntax still get their calls run.
    """
    body = _strip_think(text)
    if body is None:
        return Action(kind="invalid", error="the think block was never closed")
    call, ans = body.find("<tool_call>"), body.find("<answer>")
    if ans >= 0 and (call < 0 or ans < call):
        answer = body[ans + len("<answer>"):].split("</answer>", 1)[0].split("<|im_end|>", 1)[0].strip()
        return Action(kind="answer", answer=answer) if answer else Action(kind="invalid", error="empty answer")
    if call < 0 and "{" not in body:
        return Action(kind="invalid", error="no <tool_call> or <answer> found")
    ok, payload = _call_payload(body, call)
    if call < 0 and not (ok and isinstance(payload, dict) and "name" in payload):
        return Action(kind="invalid", error="no <tool_call> or <answer> found")
    if not ok:
        return Action(kind="invalid", error="the tool call is not valid JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return Action(kind="invalid", error='the tool call needs a "name" string')
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        decoded, value = _load_json(arguments)
        arguments = value if decoded else arguments
    if not isinstance(arguments, dict):
        return Action(kind="invalid", name=payload["name"], error='"arguments" must be a JSON object')
    return _tool_action(payload["name"], arguments, tools)


def render_tagged_action(action: Action, thought: str = "", thinking: bool = True) -> str:
    """``<think>`` (when thinking) then ``<answer>..</answer>`` or ``<tool_call>`` JSON."""
    head = f"<think>\n{thought}\n</think>\n\n" if thought and thinking else ""
    if action.kind == "answer":
        return f"{head}<answer>{action.answer}</answer>"
    if action.kind == "tool":
        call = json.dumps({"name": action.name, "arguments": action.arguments}, ensure_ascii=False)
        return f"{head}<tool_call>\n{call}\n</tool_call>"
    raise ValueError(f"cannot render an action of kind {action.kind!r}")


def error_text(obs: Observation) -> str:
    """The body of an error observation in the tagged formats (names the valid tools)."""
    names = ", ".join(n for n, _ in obs.valid_actions)
    tail = f" Call one of the tools ({names}) or give the final answer in <answer></answer>." if names else ""
    return f"Error: {_why(obs.text)}.{tail}"


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
    from tracerl.agent.chat_template import ChatTemplateFormat, has_usable_template

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
