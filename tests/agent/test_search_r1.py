"""The Search-R1 format: its prompt, tags, stop strings, and parsing that never raises."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_chat import chat_tokenizer

from tracerl.agent.formats import get_format
from tracerl.agent.search_r1 import INSTRUCTION, SearchR1Format
from tracerl.core.types import Action, Task
from tracerl.envs.base import Observation
from tracerl.envs.tools import ToolSet
from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import read_metrics


def search(query: str) -> str:
    """Search the corpus."""
    return query


def open(title: str) -> str:  # noqa: A001
    """Open a document."""
    return title


def population(city: str) -> str:
    """Population of a city."""
    return city


TOOLS = ToolSet([search, open])
TASK = Task("t", "Who wrote Velmora?", ("Tarsik",))


def test_registered_by_name_with_search_r1_markers() -> None:
    fmt = get_format("search_r1")
    assert isinstance(fmt, SearchR1Format)
    assert fmt.stop_strings == ("</search>", "</answer>") and fmt.answer_opener == "<answer>"


def test_prompt_is_search_r1_instruction_then_question() -> None:
    text = SearchR1Format().render_prompt(TASK, TOOLS)
    assert text == INSTRUCTION + " Question: Who wrote Velmora?\n"
    # The facts of Search-R1's prompt: think, search, information, answer tags, in that order.
    marks = ["<think> and </think>", "<search> query </search>", "<information> and </information>",
             "<answer> and </answer>", "<answer> Beijing </answer>"]
    positions = [text.index(m) for m in marks]
    assert positions == sorted(positions)


def test_system_prompt_and_tool_list() -> None:
    tools = ToolSet([search, open, population])
    plain = get_format("search_r1", system="Find it.")
    assert plain.render_prompt(TASK, tools) == "Find it. Question: Who wrote Velmora?\n"
    listed = get_format("search_r1", system="Find it.", tool_list=True).render_prompt(TASK, tools)
    assert listed == ("Find it. Tools: <search> query </search> (Search the corpus); <open> title </open> "
                      "(Open a document); <population> city </population> (Population of a city). "
                      "Question: Who wrote Velmora?\n")
    assert get_format("search_r1", tool_list=None).tool_list is False  # None keeps the format's default


def test_parse_search_answer_and_other_tools() -> None:
    fmt = SearchR1Format()
    cases = {
        "<think> I need the author. </think>\n<search> Velmora author </search>":
            Action(kind="tool", name="search", arguments={"query": "Velmora author"}),
        "<think>x</think><search> cut by the stop string": Action(kind="tool", name="search",
                                                                  arguments={"query": "cut by the stop string"}),
        "<think> Found it. </think>\n<answer> Tarsik </answer>": Action(kind="answer", answer="Tarsik"),
        "<open>Velmora</open>": Action(kind="tool", name="open", arguments={"title": "Velmora"}),
        # A tag quoted inside the reasoning is not an action; an unknown tag is skipped.
        "<think> maybe <search> a </search> </think> <b> bold </b> <answer>B</answer>": Action(kind="answer", answer="B"),
    }
    for text, expected in cases.items():
        assert fmt.parse(text, TOOLS) == expected, text
    assert fmt.parse("<answer>  </answer>", TOOLS).error == "empty answer"
    assert fmt.parse("<search></search>", TOOLS).error == "empty query"
    assert fmt.parse("I think it is Tarsik.", TOOLS).error == "no <search> or <answer> found"
    assert fmt.parse("<think> never closed <answer>x</answer>", TOOLS).error == "the think block was never closed"


def test_observations_and_actions_render_as_search_r1_text() -> None:
    fmt = SearchR1Format()
    obs = Observation("Velmora: a novel by Tarsik.\n", done=False, error=False)
    assert fmt.render_observation(obs) == "\n\n<information>Velmora: a novel by Tarsik.</information>\n\n"
    assert fmt.render_observation(Observation("", done=True, error=False)) == ""
    error = fmt.render_observation(Observation("no <search> or <answer> found", done=False, error=True))
    assert error.startswith("\nno <search> or <answer> found. My previous action is invalid.")
    act = Action(kind="tool", name="search", arguments={"query": "Velmora"})
    assert fmt.render_action(act, "Who?") == "<think> Who? </think>\n<search> Velmora </search>"
    assert fmt.render_action(Action(kind="answer", answer="Tarsik")) == "<answer> Tarsik </answer>"
    episode = fmt.render_episode(TASK, TOOLS, [(act, obs)])
    assert episode.endswith("</search>\n\n<information>Velmora: a novel by Tarsik.</information>\n\n")


def test_chat_template_wraps_the_instruction_as_one_user_turn() -> None:
    tok = chat_tokenizer()
    fmt = get_format("search_r1", tokenizer=tok)
    text = fmt.render_prompt(TASK, TOOLS)
    assert text == f"<|im_start|>user\n{INSTRUCTION} Question: Who wrote Velmora?\n<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.prompt_ids(TASK, TOOLS, tok) == tok.encode(text, add_special_tokens=False)


FRAGMENTS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<open>", "</open>",
             "<information>", "<", ">", "/", " ", "\n", "query", "\ud7ff", "<search", "answer>"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=25).map("".join)))
def test_parsing_never_raises(text: str) -> None:
    action = SearchR1Format().parse(text, TOOLS)
    assert action.kind in ("tool", "answer", "invalid")
    if action.kind == "tool":
        assert action.name in TOOLS and all(v.strip() for v in action.arguments.values())


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), min_size=1, max_size=30))
def test_render_then_parse_round_trips(arg: str) -> None:
    fmt = SearchR1Format()
    for action in (Action(kind="tool", name="search", arguments={"query": arg}), Action(kind="answer", answer=arg)):
        parsed = fmt.parse(fmt.render_action(action, "thinking"), TOOLS)
        if arg.strip():
            value = parsed.arguments.get("query") if parsed.kind == "tool" else parsed.answer
            assert parsed.kind == action.kind and value == arg.strip()
        else:
            assert parsed.kind == "invalid"


def test_smoke_training_with_search_r1(tmp_path: Path) -> None:
    config = resolve_config("grpo", smoke="random", overrides=["model.format=search_r1", "steps=1",
                                                          "data.verifier=answered"])
    trainer = Trainer(config, tmp_path / "run")
    assert isinstance(trainer.fmt, SearchR1Format)
    trainer.run()
    record = read_metrics(tmp_path / "run")[-1]
    assert record["step"] == 1 and math.isfinite(record["loss"])


def test_tool_list_setting_reaches_the_chat_formats() -> None:
    tok = chat_tokenizer()
    for kwargs in ({}, {"tokenizer": tok}):  # built-in Qwen3 markup, then the tokenizer's template
        listed = get_format("chat", tool_list=None, **kwargs).render_prompt(TASK, TOOLS)
        bare = get_format("chat", tool_list=False, **kwargs).render_prompt(TASK, TOOLS)
        assert '"name": "search"' in listed and "<tools>" in listed
        assert "search" not in bare.replace("searching", "") and "<tools>" not in bare
        assert "Who wrote Velmora?" in bare
