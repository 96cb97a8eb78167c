"""Concurrent tool calls in the rollout engine (issue 46): the trees of a seeded run are those of
the serial path whatever finishes first; calls of different episodes are in flight together; with
``hf_scheduling = independent`` an episode's next turn does not wait for the others' tools."""

from __future__ import annotations

import threading
import zlib

import pytest
from helpers_branching import start_and_branch
from helpers_tiny import ScriptedPolicy, tiny_model

from tracerl.agent.formats import get_format
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine

FMT = get_format("react")


def _engine(backend, env, **overrides) -> RolloutEngine:
    cfg = dict(max_turns=3, max_turn_tokens=12, max_total_tokens=400, temperature=1.0)
    cfg.update(overrides)
    return RolloutEngine(backend, env, FMT, exact_match, EngineConfig(**cfg))


def _jittered(env: ToolEnvironment) -> ToolEnvironment:
    """The real search tools, each call held back by an event wait keyed on its query, so calls
    finish in an order unrelated to the order they were made in (and never the same run to run)."""
    tools = env.tools

    def search(query: str) -> str:
        """Search the corpus."""
        threading.Event().wait((zlib.crc32(query.encode()) % 5) / 200)
        return tools.call("search", {"query": query})

    def open(title: str) -> str:  # noqa: A001 - the action grammar's name
        """Open a document."""
        threading.Event().wait((zlib.crc32(title.encode()) % 5) / 200)
        return tools.call("open", {"title": title})

    return ToolEnvironment(ToolSet([search, open]), env.config)


def _deltas(engine: RolloutEngine, tasks) -> tuple[list[dict], list[float]]:
    """:func:`start_and_branch` from a cleared prefix cache: the deltas alone, and the log-probs."""
    engine.backend.clear_prefix_cache()  # each run computes its own KV (reused KV differs in the last bits)
    records, logprobs = start_and_branch(engine, tasks)
    return [record["deltas"] for record in records], logprobs


def test_concurrent_tools_build_the_serial_trees(env, world, tok) -> None:
    """Random tiny model, real search: serial (tool_concurrency 0, lockstep: the path before issue
    46), concurrent lockstep and independent turns give the same deltas, node ids included;
    lockstep log-probs bit for bit (same batches), independent ones up to float noise."""
    policy = HFPolicy(tiny_model(len(tok), seed=4), tok)
    slow = _jittered(env)
    serial, serial_lp = _deltas(_engine(policy, slow, tool_concurrency=0), world.train[:3])
    calls = sum(len(d["nodes"]) for deltas in serial for d in deltas)
    assert calls > 6  # the trees have depth: several turns with tool calls
    concurrent, concurrent_lp = _deltas(_engine(policy, slow, tool_concurrency=8), world.train[:3])
    assert concurrent == serial
    assert concurrent_lp == serial_lp
    alone = _engine(policy, slow, tool_concurrency=8, hf_scheduling="independent")
    independent, independent_lp = _deltas(alone, world.train[:3])
    assert independent == serial
    assert len(independent_lp) == len(serial_lp)
    assert max(abs(a - b) for a, b in zip(independent_lp, serial_lp, strict=True)) < 1e-5
    assert alone.schedule.requests > 0  # the independent path ran


def _scripted(world, block):
    """Episodes that search once (``block(question)`` runs in the tool) then answer right."""
    gold = {t.question: t.gold for t in world.train}

    def respond(prefix: str) -> str:
        question = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        if prefix.count("Action:") == 0:
            return f"Thought: look it up.\nAction: search[{question}]\nObservation:"
        return f"Action: answer[{gold[question]}]"

    def search(query: str) -> str:
        """Blocks as the test says, then answers."""
        block(query)
        return f"{query} is known."

    return respond, ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=3, tool_timeout_s=60))


def test_calls_of_different_episodes_are_in_flight_together(world, tok) -> None:
    """Each search waits until all three are in flight (a barrier): served one at a time, the
    first would wait out the barrier's bound and fail as an infrastructure failure."""
    barrier = threading.Barrier(3, timeout=60)
    respond, env = _scripted(world, lambda query: barrier.wait())
    engine = _engine(ScriptedPolicy(tok, respond), env, max_turn_tokens=96, tool_concurrency=4)
    trees, _ = engine.rollout(world.train[:3], [1, 1, 1], seed=0)
    for tree in trees:
        (traj,) = tree.trajectories.values()
        assert not traj.infra_failed and traj.reward == 1.0 and traj.node_path == [0, 1, 2]


@pytest.mark.parametrize("scheduling", ["independent", "lockstep"])
def test_a_turn_proceeds_without_waiting_for_other_episodes_tools(world, tok, scheduling: str) -> None:
    """Task 0's search is released only once task 1 has answered. With independent turns task 1
    answers while task 0's call is in flight; in lockstep task 1's answer waits for that call, so
    the wait can only end at its bound (short there: it cannot be released in time)."""
    answered = threading.Event()
    slow_question = world.train[0].question
    released: list[bool] = []

    def block(query: str) -> None:
        if query == slow_question:
            released.append(answered.wait(timeout=0.5 if scheduling == "lockstep" else 60))

    respond, env = _scripted(world, block)

    def watching(prefix: str) -> str:
        text = respond(prefix)
        if text.startswith("Action: answer[") and world.train[1].question in prefix:
            answered.set()
        return text

    engine = _engine(ScriptedPolicy(tok, watching), env, max_turn_tokens=96, tool_concurrency=4,
                     hf_scheduling=scheduling)
    trees, _ = engine.rollout(world.train[:2], [1, 1], seed=0)
    first = next(iter(trees[0].trajectories.values()))
    assert first.reward == 1.0 and first.node_path == [0, 1, 2]
    assert answered.is_set() and released == [scheduling == "independent"]
