"""Independent scheduling (tracerl/rollout/independent.py) without vLLM: a request stream over a
batch backend that finishes requests newest first, one per engine step, so episodes run far out
of lockstep. The trees must come out as the lockstep engine builds them, node ids included."""

from __future__ import annotations

import itertools
import threading

import pytest
from helpers_branching import start_and_branch
from helpers_tiny import ScriptedPolicy, tiny_model

from tracerl.agent.formats import get_format
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.independent import streams_requests
from tracerl.config.schema import ConfigError, resolve_config

FMT = get_format("react")


class NewestFirstStream:
    """A :class:`~tracerl.rollout.independent.RequestStream` over ``backend.generate``: each
    ``poll`` finishes only the newest request (run alone with its own seed and budget), so an
    episode whose turn just finished races ahead while older requests wait."""

    def __init__(self, backend, on_poll=None) -> None:
        self.backend, self.tokenizer, self.stats = backend, backend.tokenizer, {}
        self.queue: list[tuple[str, list[int], object, int]] = []
        self.ids = itertools.count()
        self.on_poll = on_poll
        self.aborted: list[str] = []

    def generate(self, prefixes, params, seeds=None, routing_keys=None):
        return self.backend.generate(prefixes, params, seeds)

    def submit(self, prefix, params, seed, routing_key=None) -> str:
        self.queue.append((str(next(self.ids)), list(prefix), params, seed))
        return self.queue[-1][0]

    def poll(self):
        request, prefix, params, seed = self.queue.pop()
        out = [(request, self.backend.generate([prefix], params, [seed])[0])]
        if self.on_poll is not None:
            self.on_poll(self)
        return out

    def abort(self, request_ids) -> None:
        self.aborted += list(request_ids)
        self.queue = [q for q in self.queue if q[0] not in request_ids]


def _engine(backend, env, scheduling: str, **overrides) -> RolloutEngine:
    cfg = dict(max_turns=3, max_turn_tokens=12, max_total_tokens=400, temperature=1.0, vllm_scheduling=scheduling)
    cfg.update(overrides)
    return RolloutEngine(backend, env, FMT, exact_match, EngineConfig(**cfg))


def test_independent_trees_equal_lockstep_trees(env, world, tok) -> None:
    """Random tiny model, real search tool: same deltas (tokens, masks, observations, node ids,
    trajectories) whatever the schedule; sampled log-probs equal to float noise (a row alone vs
    in a padded batch)."""
    policy = HFPolicy(tiny_model(len(tok), seed=4), tok)
    stream = NewestFirstStream(policy)
    assert streams_requests(stream) and not streams_requests(policy)
    rows: list[int] = []
    counted = NewestFirstStream(policy)
    counted.generate = lambda prefixes, params, seeds=None, routing_keys=None: rows.append(len(prefixes)) or policy.generate(prefixes, params, seeds)
    lock, lock_lp = start_and_branch(_engine(counted, env, "lockstep"), world.train[:3])
    engine = _engine(stream, env, "independent")
    ind, ind_lp = start_and_branch(engine, world.train[:3])
    assert ind == lock
    assert len(ind_lp) == len(lock_lp) > 0
    assert max(abs(a - b) for a, b in zip(ind_lp, lock_lp, strict=True)) < 1e-5
    assert engine.schedule.requests == engine.schedule.engine_steps == sum(rows)  # one request per lockstep row
    assert engine.schedule.mixed_turn_steps > 0  # episodes at different turns were in flight together
    # the lockstep setting keeps a streaming backend in batched turns
    locked = _engine(stream, env, "lockstep")
    start_and_branch(locked, world.train[:1])
    assert locked.schedule.requests == 0


def _scripted(world, slow_question: str):
    gold = {t.question: t.gold for t in world.train}

    def respond(prefix: str) -> str:
        question = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        if prefix.count("Action:") == 0:
            query = "slow" if question == slow_question else question
            return f"Thought: look it up.\nAction: search[{query}]\nObservation:"
        return f"Action: answer[{gold[question]}]"

    return respond


def test_a_slow_tool_does_not_stall_other_episodes(world, tok) -> None:
    """The last task's search (its request finishes first: newest first) blocks until both other
    episodes have answered: with tools in a thread pool the engine keeps stepping the others and
    the call is released; run inline it would block the driver until the guard timeout."""
    release = threading.Event()
    released: list[bool] = []

    def search(query: str) -> str:
        """Blocks for 'slow' until released."""
        if query == "slow":
            released.append(release.wait(timeout=10))
        return f"{query} is a place."

    tasks = world.train[:3]
    scripted = _scripted(world, tasks[2].question)
    answers: list[str] = []

    def respond(prefix: str) -> str:
        text = scripted(prefix)
        if text.startswith("Action: answer["):
            answers.append(text)
            if len(answers) == 2:
                release.set()
        return text

    env = ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=3))
    engine = _engine(NewestFirstStream(ScriptedPolicy(tok, respond)), env, "independent", max_turn_tokens=96)
    trees, cost = engine.rollout(tasks, [1, 1, 1], seed=0)
    assert released == [True]
    assert cost.rollouts == 3 and len(answers) == 3
    for tree in trees:
        (traj,) = tree.trajectories.values()
        assert [t.action.kind for t in traj.turns] == ["tool", "answer"] and traj.reward == 1.0
        assert traj.node_path == [0, 1, 2]


def test_an_error_aborts_the_requests_in_flight(world, tok) -> None:
    """The last task answers at once (its request finishes first) and the verifier fails: the
    other two requests, still in flight, are aborted before the error propagates."""
    def verifier(answer: str, task) -> float:
        raise RuntimeError("verifier down")

    def search(query: str) -> str:
        """Always answers ok."""
        return "ok"

    last = "Question: " + world.train[2].question
    backend = ScriptedPolicy(tok, lambda prefix: "Action: answer[x]" if last in prefix else "Action: search[y]\nObservation:")
    stream = NewestFirstStream(backend)
    env = ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=3))
    engine = RolloutEngine(stream, env, FMT, verifier, EngineConfig(max_turn_tokens=96))
    with pytest.raises(RuntimeError, match="verifier down"):
        engine.rollout(world.train[:3], [1, 1, 1], seed=0)
    assert stream.queue == [] and sorted(stream.aborted) == ["0", "1"]


def test_scheduling_option_is_validated_naming_the_field() -> None:
    with pytest.raises(ValueError, match="vllm_scheduling = 'async' is not valid; allowed values: independent, lockstep"):
        EngineConfig(vllm_scheduling="async")
    with pytest.raises(ConfigError, match="rollout.engine.vllm_scheduling"):
        resolve_config("grpo", overrides=["rollout.engine.vllm_scheduling=async"])
    assert resolve_config("grpo").rollout.engine.vllm_scheduling == "independent"
