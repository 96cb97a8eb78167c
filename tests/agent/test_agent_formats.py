"""Agent formats: the react grammar exactly, chat tool calls, and parsing that never raises."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_chat import chat_tokenizer

from tracerl.agent.chat_template import ChatTemplateFormat
from tracerl.agent.formats import ChatFormat, ReactFormat, get_format
from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet


def search(query: str) -> str:
    """Search the corpus."""
    return query


def open(title: str) -> str:  # noqa: A001
    """Open a document."""
    return title


TOOLS = ToolSet([search, open])
TASK = Task("t", "Who wrote Velmora?", ("Tarsik",))
ERROR = Observation("no action found", done=False, error=True, valid_actions=(("search", "query"), ("open", "title")))


def test_react_grammar() -> None:
    fmt = get_format("react")
    assert fmt.stop_strings == ("]", "Observation:") and fmt.answer_opener == "Action: answer["
    assert fmt.render_prompt(TASK, TOOLS) == "Question: Who wrote Velmora?\n"
    assert ReactFormat(tool_list=True).render_prompt(TASK, TOOLS) == (
        "Actions: search[query] open[title] answer[text]\nQuestion: Who wrote Velmora?\n"
    )
    tool = Action(kind="tool", name="search", arguments={"query": "Velmora"})
    assert fmt.render_action(tool, thought="find the book") == (
        "Thought: find the book\nAction: search[Velmora]\nObservation:"
    )
    assert fmt.render_action(Action(kind="answer", answer="Tarsik")) == "Action: answer[Tarsik]"
    assert fmt.render_observation(Observation("Velmora: a book.", False, False)) == " Velmora: a book.\n"
    assert fmt.render_observation(ERROR) == (
        " Error: no action found. Valid actions: search[query], open[title], answer[text].\n"
    )
    assert fmt.render_observation(Observation("", True, False)) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thought: look\nAction: search[Velmora Tides]\nObservation:",
         Action(kind="tool", name="search", arguments={"query": "Velmora Tides"})),
        ("Action: open[Tarsik]", Action(kind="tool", name="open", arguments={"title": "Tarsik"})),
        ("Action: answer[ Tarsik ]", Action(kind="answer", answer="Tarsik")),
        ("Action: answer[a [b] c]\nmore", Action(kind="answer", answer="a [b] c")),
        ("I think it is Tarsik", Action(kind="invalid", error="no action found")),
        ("Action: search[]\nObservation:", Action(kind="invalid", name="search", error="empty query")),
        ("Action: answer[]", Action(kind="invalid", name="answer", error="empty answer")),
        ("Action: lookup[x]", Action(kind="invalid", name="lookup", error="unknown action lookup")),
        ("Action: search[x\n]", Action(kind="invalid", name="search", error="missing ] after the argument")),
    ],
)
def test_react_parse(text: str, expected: Action) -> None:
    assert ReactFormat().parse(text, TOOLS) == expected


def test_chat_format() -> None:
    fmt = get_format("chat", thinking=False)
    assert fmt.stop_strings == ("</tool_call>", "</answer>", "<|im_end|>") and fmt.answer_opener == "<answer>"
    prompt = fmt.render_prompt(TASK, TOOLS)
    assert prompt.startswith("<|im_start|>system\n") and '"name": "search"' in prompt
    assert prompt.endswith("<|im_start|>user\nWho wrote Velmora?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tool = Action(kind="tool", name="search", arguments={"query": "Velmora"})
    text = fmt.render_action(tool)
    assert text == '<tool_call>\n{"name": "search", "arguments": {"query": "Velmora"}}\n</tool_call>'
    assert fmt.parse(text, TOOLS) == tool
    assert fmt.render_observation(Observation("Velmora: a book.", False, False)) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nVelmora: a book.\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert "Error: no action found. Call one of the tools (search, open)" in fmt.render_observation(ERROR)


@pytest.mark.parametrize(
    ("text", "kind", "detail"),
    [
        ("<think>hmm <answer>no</answer></think>\n<answer> Tarsik </answer>", "answer", "Tarsik"),
        ('<tool_call>{"name": "open", "arguments": "{\\"title\\": \\"X\\"}"}</tool_call>', "tool", "open"),
        ("<answer>Tarsik", "answer", "Tarsik"),
        ("<tool_call>{bad json</tool_call>", "invalid", "not valid JSON"),
        ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "invalid", "unknown action fly"),
        ('<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>', "invalid", "query is empty"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "invalid", "missing argument query"),
        ('<tool_call>[1, 2]</tool_call>', "invalid", '"name"'),
        ("<think>still thinking", "invalid", "never closed"),
        ("plain words<|im_end|>", "invalid", "no <tool_call>"),
    ],
)
def test_chat_parse(text: str, kind: str, detail: str) -> None:
    action = ChatFormat().parse(text, TOOLS)
    assert action.kind == kind
    assert detail in (action.answer or action.name or action.error) or detail in action.error


FRAGMENTS = ["Action:", "Observation:", "Thought:", "search", "open", "answer", "[", "]", "\n", " ", "x",
             "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "<|im_end|>",
             '{"name": "search", "arguments": {"query": ', '"q"', "}", "{", '"', "\\", "null", "[[", "1e999"]


PARSERS = (ReactFormat(), ChatFormat(), ChatTemplateFormat(chat_tokenizer()))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=25,
)
HUGE_INT = st.integers(4_000, 6_000).map(lambda n: "9" * n)  # Python refuses int strings over 4,300 digits
DEEP = st.integers(50, 3_000).flatmap(lambda d: st.sampled_from(
    ["[" * d + "]" * d, '{"a": ' * d + "1" + "}" * d, "[" * d, '{"name": "search", "arguments": ' * d]))
SURROGATE = st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=4)
NUMBERS = st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-0", "1" + "0" * 400, "0x10", "1_000"])


def _call(name: str, arguments: str) -> str:
    return '<tool_call>{"name": ' + name + ', "arguments": ' + arguments + "}</tool_call>"


TOOL_CALLS = st.one_of(
    JSON_VALUES.map(lambda v: _call('"search"', json.dumps(v))),
    JSON_VALUES.map(lambda v: _call('"search"', json.dumps({"query": v}))),
    JSON_VALUES.map(lambda v: f"[TOOL_CALLS] {json.dumps([{'name': 'open', 'parameters': v}])}"),
    HUGE_INT.map(lambda n: _call('"search"', '{"query": ' + n + "}")),
    HUGE_INT.map(lambda n: _call(n, "{}")),
    HUGE_INT.map(lambda n: '{"name": "search", "arguments": {"query": ' + n + "}}"),
    DEEP.map(lambda d: _call('"search"', d)),
    DEEP.map(lambda d: f"<answer>{d}</answer>" if len(d) % 2 else f"Action: search[{d}]"),
    SURROGATE.map(lambda c: _call('"search"', json.dumps({"query": c}))),
    SURROGATE.map(lambda c: _call('"search"', '{"query": "\\ud800' + c + '"}')),
    SURROGATE.map(lambda c: f"Action: answer[{c}]<answer>{c}"),
    NUMBERS.map(lambda n: _call('"search"', '{"query": ' + n + "}")),
    NUMBERS.map(lambda n: _call('"search"', '"{\\"query\\": ' + n + '}"')),
)


def _check_never_raises(text: str) -> None:
    for fmt in PARSERS:
        action = fmt.parse(text, TOOLS)
        assert isinstance(action, Action)
        assert action.kind in ("tool", "answer", "invalid")
        assert (action.kind == "invalid") == bool(action.error)
        if not any("\ud800" <= c <= "\udfff" for c in text):  # decoded model text never holds surrogates
            # ... and then neither does the action: observations echoing it can be tokenised, records written
            json.dumps(dataclasses.asdict(action), ensure_ascii=False).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=25).map("".join)))
def test_parsing_never_raises(text: str) -> None:
    _check_never_raises(text)


@settings(max_examples=300, deadline=None)
@given(TOOL_CALLS)
def test_parsing_never_raises_on_hostile_json(text: str) -> None:
    """Nested JSON, 5,000-digit integers, deep nesting, lone surrogates, non-finite numbers."""
    _check_never_raises(text)


def test_hostile_tool_calls_become_invalid_actions() -> None:
    huge = "9" * 5_000
    assert ReactFormat().parse(f"Action: search[{huge}]", TOOLS).kind == "tool"  # text arguments stay text
    for fmt in PARSERS[1:]:
        assert fmt.parse(_call('"search"', '{"query": ' + huge + "}"), TOOLS).error == "the tool call is not valid JSON"
        deep = fmt.parse(_call('"search"', "[" * 100_000 + "]" * 100_000), TOOLS)
        assert deep.kind == "invalid" and deep.error
        nested = fmt.parse(_call('"search"', '{"query": {"a": [1, {"b": null}]}}'), TOOLS)
        assert nested == Action(kind="invalid", name="search", error="search argument query must be of type string")
        assert fmt.parse('{"name": "open", "parameters": {"title": "X"}}', TOOLS) == Action(
            kind="tool", name="open", arguments={"title": "X"})
        escaped = fmt.parse(_call('"\\ud800x"', '{"q\\udc00": "\\ud83d\\ude00 \\ud800"}'), TOOLS)
        assert escaped == Action(kind="invalid", name="?x", error="unknown action ?x")
        assert fmt.parse(_call('"open"', '{"title": "a\\ud800"}'), TOOLS).arguments == {"title": "a?"}


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="[]\n<", blacklist_categories=("Cs",)), min_size=1, max_size=30))
def test_render_then_parse_round_trips(arg: str) -> None:
    for fmt in (ReactFormat(), ChatFormat()):
        tool = Action(kind="tool", name="search", arguments={"query": arg})
        answer = Action(kind="answer", answer=arg)
        if arg.strip() == arg and arg.strip():
            assert fmt.parse(fmt.render_action(answer), TOOLS) == answer
            assert fmt.parse(fmt.render_action(tool), TOOLS) == tool


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="valid: chat, react"):
        get_format("xml")
