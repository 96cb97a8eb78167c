"""Where a turn ends, per format: the stop candidates a backend matches and ``ends_turn``'s verdict.

A backend stops on plain strings; the format then says whether the text so far completes the
turn. These tests pin that verdict on hand-written texts (engine behaviour: tests/rollout/test_turn_stops.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.agent.formats import AgentFormat, Qwen3MarkupFormat, ReactFormat
from tracerl.agent.search_r1 import SearchR1Format
from tracerl.agent.turn_end import OBSERVATION_MARK, action_end, tagged_ends_turn, unwritten_mark
from tracerl.core.types import Action
from tracerl.envs.tools import ToolSet


def search(query: str) -> str:
    """Search the corpus."""
    return query


def open(title: str) -> str:  # noqa: A001
    """Open a document."""
    return title


def lookup(entity: str, field: str) -> str:
    """Two arguments: not callable as a Search-R1 tag."""
    return entity + field


TOOLS = ToolSet([search, open])
REACT = ReactFormat()
MISSING = "missing ] after the argument"
_PIECES = st.lists(st.sampled_from(["Thought: ", "Action: search[", "Action: answer[", "Action:", "[", "]", "].",
                                    "\n", " ", "Lumen", "Observation:", "Obs"]), max_size=10).map("".join)


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ("Thought: see [x] here", False),  # a ] in the thought is only a candidate stop
        ("Thought: see [x] here\nAction: search[Blue River]", True),
        ("Action: search[Blue River", False),  # the action is still open
        ("Action: answer[a [b]", False),  # nested pair closed, the action's [ is not
        ("Action: answer[a [b] c]", True),
        ("Action: search[x\nmore]", True),  # a newline inside the argument breaks the action: done
        ("Nonsense without an action\nObservation:", True),  # the old stop still ends a turn
        ("Action: search[Blue River].", True),  # the closing token may carry a tail
    ],
)
def test_react_turn_ends_at_the_bracket_closing_its_action(text: str, complete: bool) -> None:
    assert REACT.ends_turn(text) is complete
    assert REACT.turn_stops(TOOLS) == ("]", "Observation:")


def test_action_end_balances_brackets_on_one_line() -> None:
    text = "Action: answer[a [b] c] tail]"
    start = text.index("[") + 1
    assert action_end(text, start) == (text.index("] tail"), True)
    assert action_end("search[x\ny]", 7) == (8, False)  # the newline comes first
    assert action_end("search[x [y]", 7) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Action: search[Blue River]. more", Action(kind="tool", name="search", arguments={"query": "Blue River"})),
        ("Action: answer[Lumen]]", Action(kind="answer", answer="Lumen")),  # the tail after ] is ignored
        ("Thought: [x] first\nAction: open[Ada Stone]",
         Action(kind="tool", name="open", arguments={"title": "Ada Stone"})),
        ("Action: search[x\nmore]", Action(kind="invalid", name="search", error=MISSING)),
        ("Action: search[x Observation: y]", Action(kind="invalid", name="search", error=MISSING)),
    ],
)
def test_react_parse_stops_where_the_turn_stops(text: str, expected: Action) -> None:
    assert REACT.parse(text, TOOLS) == expected


@pytest.mark.parametrize(
    ("written", "forced"),
    [
        ("Action: search[x]", "\nObservation:"),  # stopped on the bracket: the whole mark is forced
        ("Action: search[x]\n", "Observation:"),  # the closing token carried the newline
        ("Action: search[x]\nObserv", "ation:"),
        ("Action: search[x]\nObservation:", ""),  # stopped on the mark (pretraining texts, scripts)
        ("Nonsense Observation:", ""),
        ("ran to the cap", "\nObservation:"),
    ],
)
def test_forced_text_completes_the_observation_mark(written: str, forced: str) -> None:
    assert unwritten_mark(written, OBSERVATION_MARK) == forced
    # whatever was written, the episode then reads "...\nObservation:" (or had it already)
    assert (written + forced).endswith("Observation:")


@settings(max_examples=200, deadline=None)
@given(_PIECES, _PIECES)
def test_react_tail_after_the_end_changes_nothing(text: str, tail: str) -> None:
    """Once complete a turn stays complete, and the parser reads the same action whatever follows
    the end (the text a backend may return past the stop, e.g. the rest of the closing token)."""
    ends = [k for k in range(len(text) + 1) if REACT.ends_turn(text[:k])]
    if not ends:
        return
    k = ends[0]
    assert ends == list(range(k, len(text) + 1))  # monotone: the first complete prefix is where it stops
    assert REACT.ends_turn(text + tail)
    if "Observation:" not in text[:k]:  # ended by the action, not by the old stop
        assert REACT.parse(text[:k] + tail, TOOLS) == REACT.parse(text[:k], TOOLS)


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>', True),
        ("<think>\nI would write <tool_call>{}</tool_call>", False),  # quoted while reasoning
        ("<think>\nplan\n</think>\n\n<tool_call>{}</tool_call>", True),
        ("<think>\nunfinished <answer>x</answer><|im_end|>", True),  # the end-of-turn token always ends it
        ("<answer>Lumen</answer>", True),
    ],
)
def test_chat_turn_ends_at_a_tag_outside_the_think_block(text: str, complete: bool) -> None:
    assert Qwen3MarkupFormat().ends_turn(text) is complete
    assert tagged_ends_turn(text, "<|im_end|>") is complete


def test_search_r1_stops_on_every_one_argument_tool() -> None:
    fmt = SearchR1Format()
    assert fmt.turn_stops(ToolSet([search, open, lookup])) == ("</search>", "</answer>", "</open>")
    assert fmt.turn_stops(None) == ("</search>", "</answer>")
    assert not fmt.ends_turn("<think> maybe <search> x </search>")
    assert fmt.ends_turn("<think> maybe <search> x </search> </think> <open> Ada </open>")
    assert fmt.ends_turn("<search> Blue River </search>")


def test_base_format_ends_on_every_stop() -> None:
    class Plain(AgentFormat):
        stop_strings = ("STOP",)

        def render_prompt(self, task, tools):  # noqa: ANN001, ANN201
            return ""

        def parse(self, text, tools):  # noqa: ANN001, ANN201
            return Action(kind="invalid")

        def render_observation(self, obs):  # noqa: ANN001, ANN201
            return ""

        def render_action(self, action, thought=""):  # noqa: ANN001, ANN201
            return ""

    assert Plain().turn_stops(TOOLS) == ("STOP",) and Plain().ends_turn("anything")
