"""ToolEnvironment: answers end episodes, policy errors go on, tool failures are infra failures."""

from __future__ import annotations

import threading

import pytest

from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.tools import ToolSet

TASK = Task("t", "Who?", ("Tarsik",))
RELEASE = threading.Event()


def echo(query: str) -> str:
    """Repeat the query."""
    return f"got {query} " + "x " * 20


def crash(query: str) -> str:
    """Fail like a broken backend."""
    raise ConnectionError("backend down")


def slow(query: str) -> str:
    """Hang until released."""
    RELEASE.wait(5)
    return "late"


def env(**config: object) -> ToolEnvironment:
    return ToolEnvironment(ToolSet([echo, crash, slow]), EnvConfig(**config))  # type: ignore[arg-type]


def call(name: str, query: str = "q") -> Action:
    return Action(kind="tool", name=name, arguments={"query": query})


def test_tool_then_answer() -> None:
    episode = env(max_observation_tokens=4).start(TASK)
    obs = episode.step(call("echo", "a"))
    assert (obs.text, obs.done, obs.error) == ("got a x x ...", False, False)
    obs = episode.step(Action(kind="answer", answer="Tarsik"))
    assert (obs.text, obs.done, obs.error, obs.infra_failed) == ("", True, False, False)
    assert episode.answer == "Tarsik" and episode.turns_taken == 2
    with pytest.raises(ValueError, match="already finished"):
        episode.step(call("echo"))


def test_policy_errors_count_as_turns_and_name_valid_actions() -> None:
    episode = env(max_turns=3).start(TASK)
    obs = episode.step(Action(kind="invalid", error="no action found"))
    assert obs.error and not obs.done and not obs.infra_failed and obs.text == "no action found"
    assert obs.valid_actions == (("echo", "query"), ("crash", "query"), ("slow", "query"))
    obs = episode.step(Action(kind="tool", name="echo", arguments={"title": "x"}))
    assert obs.error and "unexpected argument title" in obs.text and not obs.done
    obs = episode.step(Action(kind="tool", name="missing", arguments={}))
    assert obs.error and obs.done and "unknown tool" in obs.text  # third turn hits max_turns
    assert episode.answer is None and not episode.infra_failed


def test_max_turns_ends_after_a_tool_call() -> None:
    episode = env(max_turns=2).start(TASK)
    assert not episode.step(call("echo")).done
    assert episode.step(call("echo")).done


def test_tool_exception_is_infra_failure() -> None:
    episode = env().start(TASK)
    obs = episode.step(call("crash"))
    assert obs.done and obs.error and obs.infra_failed and "ConnectionError" in obs.text
    assert episode.infra_failed


def test_timeout_is_infra_failure() -> None:
    RELEASE.clear()
    obs = env(tool_timeout_s=0.05).start(TASK).step(call("slow"))
    RELEASE.set()
    assert obs.infra_failed and obs.done and "timed out" in obs.text


def test_clone_resumes_from_a_boundary_independently() -> None:
    episode = env(max_turns=3).start(TASK)
    episode.step(call("echo", "a"))
    branch = episode.clone()
    episode.step(call("echo", "b"))
    assert branch.turns_taken == 1 and len(branch.history) == 1
    branch.step(call("echo", "c"))
    assert branch.step(Action(kind="invalid", error="x")).done  # third turn: cut off
    assert branch.done and not episode.done
    assert [a.arguments["query"] for a, _ in episode.history] == ["a", "b"]


@pytest.mark.parametrize(("field", "value"), [("max_turns", 0), ("max_observation_tokens", 0), ("tool_timeout_s", 0)])
def test_config_errors(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        EnvConfig(**{field: value})
