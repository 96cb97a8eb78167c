"""The ``chat`` format on the tokenizer's own chat template, token-exact turn by turn.

Any local Hugging Face checkpoint brings its template (Qwen, Llama, Gemma, Mistral, ...). The
prompt ``S_0`` is ``apply_chat_template([system?, user], tools=..., add_generation_prompt=True)``
rendered to text and encoded with ``add_special_tokens=False``: exactly what
``apply_chat_template(tokenize=True)`` does (the template writes its own BOS), with the text kept.

After that nothing is re-tokenised from the full history. The sampled assistant tokens stay as
sampled; the forced tokens after a turn are

1. the rest of the template's end of an assistant turn (``<|im_end|>\\n`` for Qwen): only the
   ``\\n`` when the policy emitted ``<|im_end|>`` itself, all of it when it stopped on a stop string
   such as ``</tool_call>`` (or hit the length cap) without it;
2. the template's rendering of the tool message plus the next generation prompt, by the *delta*
   method: render a fixed reference conversation ending in an assistant turn, render it again
   with the tool message and ``add_generation_prompt=True``, and take the suffix. The shorter
   rendering must be a prefix of the longer (checked at construction and on every observation).

TRL extracts its tool-suffix ids the same way (and checks prefix preservation first); verl instead
renders the tool messages alone and strips the system prompt the template adds. The reference
assistant turn carries a think block, so templates that keep reasoning only on turns that have
some (Qwen3) render it the same whether or not a message follows. Such a template re-renders a
*whole* history differently from what the policy saw (Qwen3 drops the empty think block of past
no-think turns); the ids here are the ones the policy saw, turn by turn, which is what the loss
needs.

Tool results are ``tool`` messages; a template that rejects that role (raises, e.g. strict role
alternation) or drops its content gets ``user`` messages instead (detected at construction).
Templates that ignore ``tools=`` (Gemma) get the tool list in the system text; templates without
a system role get the system text at the head of the user message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tracerl.agent.base import AgentFormat
from tracerl.agent.tagged import (
    DEFAULT_SYSTEM,
    TOOL_CALL_HELP,
    error_text,
    parse_tagged,
    render_tagged_action,
    tool_listing,
)
from tracerl.agent.template_sandbox import TemplateLimitError, sandbox_for
from tracerl.agent.turn_end import tagged_ends_turn
from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet

_QUESTION = "tracerl reference question"
_SYSTEM_MARK = "tracerl-reference-system"
_ANSWER_MARK = "tracerl-reference-answer"
_OBS_MARK = "tracerl-reference-observation"
_TOOL_MARK = "tracerl_reference_tool"


def has_usable_template(tokenizer: Any) -> bool:
    """Whether the tokenizer has a chat template that marks turns.

    A template that renders a user message as its bare content (the embedded tiny tokenizer's
    concatenation template) cannot delimit turns; ``chat`` then uses the built-in Qwen3 markup.
    A template that raises counts as usable, so the format's construction reports the error.
    """
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:  # in the sandbox: a stranger's template is code (agent/template_sandbox.py)
        text = sandbox_for(tokenizer).render([{"role": "user", "content": _QUESTION}], add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - any template failure is reported by ChatTemplateFormat
        return True
    return str(text).strip() != _QUESTION


def _schemas(tools: ToolSet) -> list[dict[str, Any]]:
    """Tool schemas in the layout ``apply_chat_template(tools=...)`` expects."""
    return [{"type": "function", "function": s} for s in tools.schemas()]


class ChatTemplateFormat(AgentFormat):
    """``chat`` with the markup of ``tokenizer.chat_template`` (see the module docstring)."""

    name = "chat"
    answer_opener = "<answer>"

    def __init__(self, tokenizer: Any, system: str = "", thinking: bool = True, tool_list: bool = True) -> None:
        self.tokenizer = tokenizer
        self.tool_list = tool_list
        """Whether the prompt lists the tools (``tools=`` to the template, or in the system text)."""
        self.system = system or DEFAULT_SYSTEM
        self.thinking = thinking
        """Passed to the template as ``enable_thinking`` (Qwen3 no-think mode when False)."""
        self.system_role = self._accepts_system()
        """Whether the system text is a system message (else it heads the user message)."""
        self.renders_tools = self._renders_tools()
        self.observation_role = ""
        """``tool``, or ``user`` where the template rejects tool messages."""
        failures = []
        # A template may move the system message (Mistral puts it before the last user turn):
        # then the system text goes into the first user message instead.
        for system_role in dict.fromkeys([self.system_role, False]):
            self.system_role = system_role
            try:
                self._reference_turn()
                self.observation_role = self._observation_role()
                break
            except TemplateLimitError:
                raise
            except ValueError as exc:
                failures.append(str(exc))
        else:
            raise ValueError(" / ".join(failures))
        self.end_token = self._end_token()
        """The special token that ends an assistant turn ('' when the template has none)."""
        self.stop_strings = ("</tool_call>", "</answer>") + ((self.end_token,) if self.end_token else ())

    # --- construction checks --------------------------------------------------------------

    def _reference_turn(self) -> None:
        """Render the reference conversation up to a closed assistant turn; read its end of turn."""
        self._reference = self._messages(_QUESTION, None)
        thought = "<think>\ntracerl reference thought\n</think>\n\n"
        self._assistant = {"role": "assistant", "content": thought + _ANSWER_MARK}
        closed = self._render(self._reference + [self._assistant], generation=False)
        if _ANSWER_MARK not in closed:
            raise ValueError("the chat template drops the content of assistant messages")
        self._closed = closed
        self.end_of_turn = closed[closed.rindex(_ANSWER_MARK) + len(_ANSWER_MARK):]
        """Text the template writes after an assistant message's content (``<|im_end|>\n`` for Qwen)."""
        self._end_ids = self._encode(self.end_of_turn)

    def _render(self, messages: list[dict[str, str]], generation: bool, tools: Any = None) -> str:
        """The template's text, rendered under a time, memory and size limit (agent/template_sandbox.py)."""
        return sandbox_for(self.tokenizer).render(messages, tools=tools, add_generation_prompt=generation,
                                                  enable_thinking=self.thinking)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _accepts_system(self) -> bool:
        try:
            text = self._render([{"role": "system", "content": _SYSTEM_MARK},
                                 {"role": "user", "content": _QUESTION}], generation=True)
        except TemplateLimitError:
            raise
        except Exception:  # noqa: BLE001 - e.g. "System role not supported" (Gemma 2)
            return False
        return _SYSTEM_MARK in text

    def _renders_tools(self) -> bool:
        tool = {"type": "function", "function": {"name": _TOOL_MARK, "description": "x",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            text = self._render([{"role": "user", "content": _QUESTION}], generation=True, tools=[tool])
        except TemplateLimitError:
            raise
        except Exception:  # noqa: BLE001 - a template that cannot take tools=
            return False
        return _TOOL_MARK in text

    def _observation_role(self) -> str:
        reasons = []
        for role in ("tool", "user"):
            try:
                delta = self._delta(role, _OBS_MARK)
            except TemplateLimitError:
                raise
            except Exception as exc:  # noqa: BLE001 - a template rejecting the role raises anything
                reasons.append(f"{role!r}: {exc}")
                continue
            if _OBS_MARK in delta:
                return role
            reasons.append(f"{role!r}: the message content is not rendered")
        raise ValueError("the chat template cannot append an observation after an assistant turn ("
                         + "; ".join(reasons) + ")")

    def _end_token(self) -> str:
        """The special token that ends an assistant turn (a stop string), or ''."""
        if not self._end_ids:
            return ""
        first = self.tokenizer.convert_ids_to_tokens(self._end_ids[0])
        added = getattr(self.tokenizer, "added_tokens_decoder", {}).get(self._end_ids[0])
        special = first in set(self.tokenizer.all_special_tokens) or bool(getattr(added, "special", False))
        return first if special else ""

    # --- rendering --------------------------------------------------------------------------

    def _messages(self, question: str, tools: ToolSet | None) -> list[dict[str, str]]:
        system = self.system
        if tools is not None and not self.renders_tools:
            system += f"\n\n# Tools\n\n<tools>\n{tool_listing(tools)}\n</tools>\n\n{TOOL_CALL_HELP}"
        if self.system_role:
            return [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return [{"role": "user", "content": f"{system}\n\n{question}"}]

    def _delta(self, role: str, content: str) -> str:
        """The template's text for one ``role`` message after an assistant turn, plus the generation prompt."""
        full = self._render(self._reference + [self._assistant, {"role": role, "content": content}], generation=True)
        if not full.startswith(self._closed):
            raise ValueError(
                "the chat template is not prefix-stable: appending a message changes how the earlier "
                "assistant turn is rendered, so per-turn token ids would not match the template")
        return full[len(self._closed):]

    def _closing(self, sampled_ids: Sequence[int]) -> str:
        """The part of the end-of-turn text the policy did not sample itself."""
        ids = list(sampled_ids)
        for k in range(min(len(self._end_ids), len(ids)), 0, -1):
            if ids[-k:] == self._end_ids[:k]:
                done = self.tokenizer.decode(self._end_ids[:k], skip_special_tokens=False)
                if self.end_of_turn.startswith(done):
                    return self.end_of_turn[len(done):]
        return self.end_of_turn

    def render_prompt(self, task: Task, tools: ToolSet) -> str:
        listed = tools if self.tool_list else None
        schemas = _schemas(tools) if self.renders_tools and self.tool_list else None
        return self._render(self._messages(task.question, listed), generation=True, tools=schemas)

    def prompt_ids(self, task: Task, tools: ToolSet, tokenizer: Any = None) -> list[int]:
        """The template's own tokenisation of the prompt (no BOS added: the template writes it)."""
        return self._encode(self.render_prompt(task, tools))

    def _observation_text(self, obs: Observation) -> str:
        return self._delta(self.observation_role, error_text(obs) if obs.error else obs.text)

    def render_observation(self, obs: Observation) -> str:
        """Forced text after a turn that ended on a stop string (end of turn, tool message, next prompt)."""
        if obs.done and not obs.text and not obs.error:
            return ""
        return self.end_of_turn + self._observation_text(obs)

    def observation_ids(self, obs: Observation, sampled_ids: Sequence[int], tokenizer: Any = None) -> list[int]:
        """Forced ids after a turn that sampled ``sampled_ids``: the missing end of turn, then the delta."""
        if obs.done and not obs.text and not obs.error:
            return []
        return self._encode(self._closing(sampled_ids) + self._observation_text(obs))

    def parse(self, text: str, tools: ToolSet) -> Action:
        return parse_tagged(text, tools)

    def ends_turn(self, text: str) -> bool:
        return tagged_ends_turn(text, self.end_token)

    def render_action(self, action: Action, thought: str = "") -> str:
        return render_tagged_action(action, thought, self.thinking)

    def describe(self) -> str:
        """One line for logs: which roles and end-of-turn text the template gave."""
        return json.dumps({"system_role": self.system_role, "renders_tools": self.renders_tools,
                           "observation_role": self.observation_role, "end_of_turn": self.end_of_turn})
