"""The tagged markup of the ``chat`` formats: ``<tool_call>`` JSON, ``<answer>``, tool listings.

:func:`parse_tagged` reads an assistant turn (a bare JSON call also counts), :func:`render_tagged_action`
writes one, :func:`error_text` is the body of an error observation, and :data:`DEFAULT_SYSTEM`,
:data:`TOOL_CALL_HELP` and :func:`tool_listing` make the system text. Shared by the built-in Qwen3
markup (:class:`~tracerl.agent.formats.Qwen3MarkupFormat`) and the tokenizer's own chat template
(:class:`~tracerl.agent.chat_template.ChatTemplateFormat`); re-exported by :mod:`tracerl.agent.formats`.
"""

from __future__ import annotations

import json
from typing import Any

from tracerl.agent.base import _tool_action, _why
from tracerl.agent.turn_end import strip_think as _strip_think
from tracerl.core.types import Action
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet

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
