"""The seam between planning and execution: branch indices from the driver, adoption of trees by
another executor, weights versions, self-contained score requests, tool stats in results and
routing keys reaching the backend."""

from __future__ import annotations

import json

import pytest
from helpers_tiny import ScriptedPolicy, tiny_model

from tracerl.agent.formats import get_format
from tracerl.core.protocol import (
    AdoptRequest,
    ExpandRequest,
    ScoreRequest,
    StartRequest,
    apply_scores,
    from_json,
    score_requests,
    task_record,
    to_json,
    tree_delta,
)
from tracerl.core.types import RolloutTree
from tracerl.envs.health import ToolStats
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.models.scoring import ReferenceScorer
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.executor import LocalExecutor, VersionError
from tracerl.allocation.schemes import expandable_nodes
from tracerl.allocation.session import RolloutSession

CFG = EngineConfig(max_turns=3, max_turn_tokens=16, max_total_tokens=400, temperature=1.0)


class KeyedPolicy(HFPolicy):
    """The real HF backend, remembering the routing keys of each generate call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keys: list[list[str] | None] = []

    def generate(self, prefixes, params, seeds=None, *, generator=None, routing_keys=None):
        self.keys.append(routing_keys)
        return super().generate(prefixes, params, seeds, generator=generator, routing_keys=routing_keys)


def _executor(tok, env, worker: str = "local") -> LocalExecutor:
    """A tiny random policy (the same weights every time: seed 4) behind its own engine."""
    policy = KeyedPolicy(tiny_model(len(tok), seed=4), tok)
    return LocalExecutor(RolloutEngine(policy, env, get_format("react"), exact_match, CFG), worker=worker)


def _plain(records) -> tuple[list[dict], list[float]]:
    """Protocol records as JSON data without log-probs, and the log-probs in order (batch shapes
    may move those in the last float bits; tokens, observations and node ids must be equal)."""
    data, logprobs = [json.loads(to_json(r)) for r in records], []
    for delta in data:
        for node in delta["nodes"]:
            logprobs += node["turn"].pop("logprobs")
        for traj in delta["trajectories"]:
            for turn in traj["turns"]:
                turn.pop("logprobs")
    return data, logprobs


def _same(a, b) -> None:
    (da, la), (db, lb) = _plain(a), _plain(b)
    assert da == db
    assert la == pytest.approx(lb, abs=1e-5)




def _anchors(tree: RolloutTree, most: int = 2) -> list[int]:
    return expandable_nodes(tree)[:most] or [0]


class Split:
    """Two executors behind one: each tree lives on the executor its id was first sent to."""

    def __init__(self, first: LocalExecutor, second: LocalExecutor, second_trees: set[str]) -> None:
        self.parts, self.second = (first, second), second_trees

    def _of(self, tree_id: str) -> LocalExecutor:
        return self.parts[tree_id in self.second]

    def prompt_ids(self, tasks):
        return self.parts[0].prompt_ids(tasks)

    def start(self, requests):
        return self._merge(requests, "start")

    def expand(self, requests):
        return self._merge(requests, "expand")

    def _merge(self, requests, call):
        results = [getattr(ex, call)([r for r in requests if self._of(r.tree_id) is ex]) for ex in self.parts]
        merged = results[0]
        merged.deltas = sorted(results[0].deltas + results[1].deltas,
                               key=lambda d: [r.tree_id for r in requests].index(d.tree_id))
        merged.rollouts += results[1].rollouts
        merged.generated_tokens += results[1].generated_tokens
        return merged

    def forget(self, tree_ids) -> None:
        for ex in self.parts:
            ex.forget(tree_ids)


def _two_rounds(session: RolloutSession, world) -> list[RolloutTree]:
    trees, _ = session.start(world.train[:3], [2, 2, 1], ["t0", "t1", "t2"])
    session.expand([(t.tree_id, n, 2) for t in trees for n in _anchors(t)])
    session.expand([(t.tree_id, n, 1) for t in trees for n in _anchors(t, 3)] + [("t1", 0, 2)])
    return trees


def test_expansions_split_over_two_executors_give_the_same_episodes(tok, env, world) -> None:
    one = _two_rounds(RolloutSession(_executor(tok, env), seed=7), world)
    split = Split(_executor(tok, env, "a"), _executor(tok, env, "b"), {"t1"})
    two = _two_rounds(RolloutSession(split, seed=7), world)
    _same([tree_delta(t) for t in one], [tree_delta(t) for t in two])
    assert split.parts[1].engine.tree("t1").nodes and not split.parts[0].engine.can_expand("t1", 0)


def test_first_branch_from_the_driver_numbers_the_continuation(tok, env, world) -> None:
    """Root branch 3 is the same episode whether it is the last of three continuations after one
    chain or the only one of a request that says ``first_branch = 3`` to an executor that ran none."""
    a, b = _executor(tok, env), _executor(tok, env)
    task = task_record(world.train[0])
    for ex in (a, b):
        ex.start([StartRequest("t", task, 1, seed=3)])  # branch 0 of the root
    a.expand([ExpandRequest("t", 0, 3, seed=4)])  # branches 1, 2, 3 (the executor's own count)
    b.expand([ExpandRequest("t", 0, 1, seed=4, first_branch=3)])

    def branch(ex: LocalExecutor, i: int) -> list[int]:  # root children are the branches in order
        tree = ex.engine.tree("t")
        return next(t.token_ids for t in tree.trajectories.values() if t.node_path[1] == tree.root.children[i])

    assert branch(b, 1) == branch(a, 3)
    assert branch(b, 1) != branch(a, 2)  # the branch index matters
    assert b.engine._states["t"].branches[0] == 4  # the executor's own count follows the driver's


def test_an_adopting_executor_continues_the_trees_exactly_without_calling_tools(tok, env, world) -> None:
    a = _executor(tok, env, "a")
    session = RolloutSession(a, seed=3)
    trees, _ = session.start(world.train[:2], [3, 2], ["t0", "t1"])
    session.expand([(t.tree_id, n, 2) for t in trees for n in _anchors(t)])
    b = _executor(tok, env, "b")
    calls = env.stats.calls
    b.adopt([from_json(AdoptRequest, to_json(r)) for r in session.adopt_requests(["t0", "t1"])])
    assert env.stats.calls == calls  # adoption replays recorded observations
    requests = session.expand_requests([(t.tree_id, n, 2) for t in trees for n in _anchors(t, 3)] + [("t0", 0, 1)])
    assert requests[-1].first_branch == 3  # the root had 3 chains
    _same(b.expand(requests).deltas, a.expand(requests).deltas)


def _scripted_executor(tok, env) -> LocalExecutor:
    def respond(text: str) -> str:  # one search, then the answer
        return "Action: answer[Lumen]" if "search[Lumen]" in text else "Thought: look.\nAction: search[Lumen]"

    return LocalExecutor(RolloutEngine(ScriptedPolicy(tok, respond), env, get_format("react"), exact_match, CFG))


def test_results_carry_tool_stats_and_adoption_rebuilds_the_episodes(tok, env, world) -> None:
    a = _scripted_executor(tok, env)
    task = task_record(world.train[0])
    started = a.start([StartRequest("s", task, 2, seed=1), StartRequest("u", task_record(world.train[1]), 1, seed=1)])
    assert ToolStats(**started.tool_stats).calls == 3 and ToolStats(**started.tool_stats).failures == 0
    session = RolloutSession(a, seed=1)
    trees, _ = session.start(world.train[:1], [2], ["s"])
    b = _scripted_executor(tok, env)
    calls = env.stats.calls
    b.adopt(session.adopt_requests(["s"]))
    assert env.stats.calls == calls
    boundaries = [n.id for n in trees[0].nodes[1:] if not n.is_leaf]
    assert len(boundaries) == 2  # one after each chain's search
    for node in boundaries:
        mine, theirs = b.engine._states["s"].episodes[node], a.engine._states["s"].episodes[node]
        assert mine.turns_taken == theirs.turns_taken == 1
        assert [(act, obs.text, obs.error) for act, obs in mine.history] == \
               [(act, obs.text, obs.error) for act, obs in theirs.history]
    expanded = b.expand(session.expand_requests([("s", boundaries[0], 2)]))
    assert ToolStats(**expanded.tool_stats).calls == 0  # the continuations answer at once
    assert expanded.worker == "local" and expanded.seconds > 0 and expanded.rollouts == 2


def test_an_environment_that_cannot_restore_is_refused(tok, env, world) -> None:
    class NoRestore:
        tools = env.tools

        def start(self, task):
            class Episode:
                turns_taken = 0

                def step(self, action):
                    raise AssertionError("adoption must not step")

                def clone(self):
                    return self

            return Episode()

    a = _scripted_executor(tok, env)
    session = RolloutSession(a, seed=1)
    session.start(world.train[:1], [1], ["s"])
    engine = RolloutEngine(ScriptedPolicy(tok, lambda _: ""), NoRestore(), get_format("react"), exact_match, CFG)
    with pytest.raises(ValueError, match="Episode episodes have no restore"):
        LocalExecutor(engine).adopt(session.adopt_requests(["s"]))
    assert callable(env.start(world.train[0]).restore)  # a ToolEpisode can


def test_a_request_for_weights_the_executor_does_not_hold_is_refused(tok, env, world) -> None:
    ex = _executor(tok, env, "w0")
    task = task_record(world.train[0])
    with pytest.raises(VersionError, match="asks for weights version 1; executor 'w0' holds version 0"):
        ex.start([StartRequest("t", task, 1, seed=1, version=1)])
    ex.sync_weights(ex.backend.model, 1)
    assert ex.start([StartRequest("t", task, 1, seed=1, version=1)]).version == 1
    with pytest.raises(VersionError, match="expand of tree 't' asks for weights version 0; executor 'w0' holds version 1"):
        ex.expand([ExpandRequest("t", 0, 1, seed=1, version=0)])


def test_routing_keys_are_the_tree_ids_of_the_rows(tok, env, world) -> None:
    ex = _executor(tok, env)
    result = ex.start([StartRequest("p", task_record(world.train[0]), 2, seed=1),
                       StartRequest("q", task_record(world.train[1]), 1, seed=1)])
    assert ex.backend.keys[0] == ["p", "p", "q"]
    # the backend's counters for this call: every generated token it sampled, the prompts prefilled
    assert result.backend_stats["generated_tokens"] >= result.generated_tokens > 0
    assert result.backend_stats["prefill_tokens"] > 0
    ex.expand([ExpandRequest("q", 0, 2, seed=2)])
    assert all(keys == ["q"] * len(keys) for keys in ex.backend.keys[-1:])


def test_score_requests_are_self_contained_and_equal_scoring_through_the_tree(tok, env, world) -> None:
    """The driver's requests, through JSON, scored by a scorer that holds no tree (another model
    object with the same weights), equal the tree-level scorer on the executor's own trees."""
    ex = _executor(tok, env)
    session = RolloutSession(ex, seed=5)
    trees, _ = session.start(world.train[:2], [3, 2], ["t0", "t1"])
    session.expand([(t.tree_id, n, 2) for t in trees for n in _anchors(t)])
    tasks = {t.id: t for t in world.train}
    requests = [from_json(ScoreRequest, to_json(r)) for r in score_requests(trees, tasks)]
    assert {r.tree_id for r in requests} == {"t0", "t1"}
    for r in requests:  # each node once; its prefix is the tree's prefix there
        assert len(set(r.node_ids)) == len(r.node_ids)
        assert r.prefixes == [session.trees[r.tree_id].prefix_ids(n) for n in r.node_ids]
    elsewhere = ReferenceScorer(tiny_model(len(tok), seed=4), tok, get_format("react"))
    apply_scores(trees, elsewhere.score_nodes(requests))
    held = [ex.engine.tree(t.tree_id) for t in trees]
    ReferenceScorer(ex.backend.model, tok, get_format("react")).score(held, tasks)  # through the tree
    for mine, theirs in zip(trees, held, strict=True):
        assert [n.readiness is None for n in mine.nodes] == [n.readiness is None for n in theirs.nodes]
        assert [n.readiness for n in mine.nodes if n.readiness is not None] == \
               pytest.approx([n.readiness for n in theirs.nodes if n.readiness is not None], abs=1e-5)
        for leaf, traj in theirs.trajectories.items():
            assert mine.trajectories[leaf].readiness == pytest.approx(traj.readiness, abs=1e-5)
    assert score_requests(trees, tasks) == []  # nothing left to score


def test_a_tasks_prompt_states_and_trees_have_one_owner() -> None:
    """Routing by task id: stable (a digest, not Python's salted hash), in range, and spread."""
    from tracerl.core.protocol import worker_of

    owners = [worker_of(f"task-{i}", 3) for i in range(30)]
    assert owners == [worker_of(f"task-{i}", 3) for i in range(30)] and set(owners) == {0, 1, 2}
    assert worker_of("task-0", 1) == 0
    with pytest.raises(ValueError, match="workers must be >= 1"):
        worker_of("task-0", 0)
