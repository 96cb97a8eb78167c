"""The executor protocol: JSON records, trees addressed by id, planners as pure functions of snapshots,
and per-request seeds (a trajectory does not depend on the batch it ran in)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random

import pytest
from helpers_tiny import tiny_model

from tracerl.agent.formats import get_format
from tracerl.allocation.predictor import SuccessPredictor
from tracerl.allocation.trace_scheme import TraceScheme
from tracerl.core.types import RolloutTree
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.core.protocol import (
    ExpandRequest,
    NodeRecord,
    RolloutResult,
    ScoreRequest,
    ScoreResult,
    StartRequest,
    TreeDelta,
    apply_delta,
    from_json,
    task_from_record,
    task_record,
    to_json,
)
from tracerl.rollout.executor import LocalExecutor
from tracerl.allocation.schemes import SchemeConfig, TreeRandomScheme, expandable_nodes
from tracerl.allocation.session import RolloutSession

def _engine(tok, env, cache: bool = True) -> RolloutEngine:
    policy = HFPolicy(tiny_model(len(tok), seed=4), tok, prefix_cache_bytes=256 * 2**20 if cache else 0)
    cfg = EngineConfig(max_turns=3, max_turn_tokens=16, max_total_tokens=400, temperature=1.0)
    return RolloutEngine(policy, env, get_format("react"), exact_match, cfg)


def _tokens(tree: RolloutTree) -> list[tuple[int, list[int], float]]:
    return [(leaf, t.token_ids, t.reward) for leaf, t in sorted(tree.trajectories.items())]


def _same_tree(a: RolloutTree, b: RolloutTree) -> None:
    assert (a.tree_id, a.task_id, a.prompt_ids) == (b.tree_id, b.task_id, b.prompt_ids)
    assert [(n.id, n.parent, n.children, n.reward, n.readiness) for n in a.nodes] == \
           [(n.id, n.parent, n.children, n.reward, n.readiness) for n in b.nodes]
    assert [dataclasses.asdict(n.turn) if n.turn else None for n in a.nodes] == \
           [dataclasses.asdict(n.turn) if n.turn else None for n in b.nodes]
    assert {k: dataclasses.asdict(t) for k, t in a.trajectories.items()} == \
           {k: dataclasses.asdict(t) for k, t in b.trajectories.items()}


def test_records_round_trip_through_json_and_pickle(tok, env, world) -> None:
    executor = LocalExecutor(_engine(tok, env))
    start = [StartRequest("a", task_record(world.train[0]), 2, 11), StartRequest("b", task_record(world.train[1]), 1, 11)]
    for record in start + [ExpandRequest("a", 3, 2, 11)]:
        assert from_json(type(record), to_json(record)) == record
        assert pickle.loads(pickle.dumps(record)) == record
    assert task_from_record(json.loads(json.dumps(task_record(world.train[0])))) == world.train[0]
    result = executor.start(start)
    assert [d.tree_id for d in result.deltas] == ["a", "b"] and result.rollouts == 3
    again = from_json(RolloutResult, to_json(result))
    assert again == result and isinstance(again.deltas[0], TreeDelta)
    scores = ScoreResult(nodes={"a": {"0": -1.5}}, trajectories={"a": {"2": [-1.5, -0.25]}})
    assert from_json(ScoreResult, to_json(scores)) == scores


def test_driver_copies_equal_the_executor_trees_and_expand_by_id_after_a_rebuild(tok, env, world) -> None:
    engine = _engine(tok, env)
    session = RolloutSession(LocalExecutor(engine), seed=3)
    trees, cost = session.start(world.train[:2], [3, 2], ["t0", "t1"])
    assert cost.rollouts == 5
    for tree in trees:
        assert tree is not engine.tree(tree.tree_id)  # no shared objects: the copy is built from deltas
        _same_tree(tree, engine.tree(tree.tree_id))
    # Serialise the driver's view, rebuild it in a "new process", then expand by tree id.
    wire = [to_json(TreeDelta(t.tree_id, t.task_id, 1, [], [], t.prompt_ids)) for t in trees]
    rebuilt: dict[str, RolloutTree] = {}
    for text in wire:
        apply_delta(rebuilt, from_json(TreeDelta, text))
    history = json.dumps([[(n.parent, dataclasses.asdict(n.turn)) for n in t.nodes[1:]] for t in trees])
    for tree, nodes in zip(trees, json.loads(history), strict=True):
        for parent, turn in nodes:
            apply_delta(rebuilt, TreeDelta(tree.tree_id, tree.task_id, len(rebuilt[tree.tree_id].nodes),
                                           [NodeRecord(parent, turn)]))
    anchors = [n for n in expandable_nodes(rebuilt["t0"])] or [0]
    before = len(engine.tree("t0").nodes)
    result = session.executor.expand([ExpandRequest("t0", anchors[0], 2, 5), ExpandRequest("t1", 0, 1, 5)])
    assert result.rollouts == 3 and [d.tree_id for d in result.deltas] == ["t0", "t1"]
    assert result.deltas[0].first_node == before == len(rebuilt["t0"].nodes)
    apply_delta(rebuilt, result.deltas[0])
    assert [n.turn.assistant_ids for n in rebuilt["t0"].nodes[1:]] == \
           [n.turn.assistant_ids for n in engine.tree("t0").nodes[1:]]
    with pytest.raises(ValueError, match="was lost or applied twice"):
        apply_delta(rebuilt, result.deltas[0])
    session.forget()
    with pytest.raises(ValueError, match="not produced by this engine"):
        engine.expand([("t0", 0, 1)])


def test_trajectories_do_not_depend_on_the_batch(tok, env, world) -> None:
    """The same (seed, tree id, node, branch) gives the same episode alone or batched with others."""
    alone = _engine(tok, env, cache=False)
    (tree,), _ = alone.rollout([world.train[2]], [2], tree_ids=["x"], seed=17)
    crowd = _engine(tok, env, cache=False)
    trees, _ = crowd.rollout(world.train[:3], [3, 1, 2], tree_ids=["p", "q", "x"], seed=17)
    assert _tokens(trees[2]) == _tokens(tree)
    other, _ = _engine(tok, env, cache=False).rollout([world.train[2]], [2], tree_ids=["x"], seed=18)
    assert _tokens(other[0]) != _tokens(tree)  # the seed matters
    # Continuations: the branch index counts per node across calls, so a later root
    # continuation is a new episode, not a replay of chain 0.
    alone.expand([("x", 0, 1)], seed=17)
    crowd.expand([("p", 0, 1), ("x", 0, 1)], seed=17)
    assert _tokens(alone.tree("x")) == _tokens(crowd.tree("x"))
    new_leaf = max(alone.tree("x").trajectories)
    assert alone.tree("x").trajectories[new_leaf].token_ids != alone.tree("x").trajectories[min(tree.trajectories)].token_ids


def test_readiness_is_the_executors_score_call(tok, env, world) -> None:
    def score(requests):  # readable stand-in for ReferenceScorer.score_nodes: l = -node id
        assert all(r.gold == world.train[0].gold for r in requests)
        return ScoreResult(nodes={r.tree_id: {str(n): -float(n) for n in r.node_ids} for r in requests})

    engine = _engine(tok, env)
    session = RolloutSession(LocalExecutor(engine, score), seed=1)
    (tree,), _ = session.start(world.train[:1], [3], ["r"])
    assert all(t.readiness is None for t in tree.trajectories.values())
    session.score([tree])
    for traj in tree.trajectories.values():
        nodes = [traj.node_path[0]] + [traj.node_path[i + 1] for i, t in enumerate(traj.turns) if t.is_transition]
        assert traj.readiness == [-float(n) for n in nodes]
    with pytest.raises(ValueError, match="no reference scorer"):
        LocalExecutor(engine).score([ScoreRequest("r", tree.task_id, "x", [0], [[1]])])


def test_planners_emit_the_same_plan_for_the_same_snapshot(tok, env, world) -> None:
    engine = _engine(tok, env)
    session = RolloutSession(LocalExecutor(engine), seed=9)
    trees, _ = session.start(world.train[:4], [3] * 4, [f"s{i}" for i in range(4)])
    copies: dict[str, RolloutTree] = {}
    for tree in trees:  # a snapshot that went through JSON
        apply_delta(copies, TreeDelta(tree.tree_id, tree.task_id, 1, prompt_ids=list(tree.prompt_ids)))
        nodes = [NodeRecord(n.parent, json.loads(json.dumps(dataclasses.asdict(n.turn)))) for n in tree.nodes[1:]]
        trajs = [json.loads(json.dumps(dataclasses.asdict(t))) for _, t in sorted(tree.trajectories.items())]
        apply_delta(copies, TreeDelta(tree.tree_id, tree.task_id, 1, nodes, trajs))
    snapshot = [copies[t.tree_id] for t in trees]
    trace = TraceScheme(SchemeConfig(group_size=4, trace_max_per_anchor=2), SuccessPredictor())
    plan, anchors = trace.plan_stage2(trees, [0] * 4, 8)
    assert trace.plan_stage2(snapshot, [0] * 4, 8) == (plan, anchors)
    assert sum(k for _, _, k in plan) == (8 if anchors else 0)
    assert all(engine.can_expand(tid, nid) for tid, nid, _ in plan)
    tree_random = TreeRandomScheme(SchemeConfig(tree_expand_nodes=2, tree_continuations=1))
    assert tree_random._plan(trees, 6, random.Random(0)) == tree_random._plan(snapshot, 6, random.Random(0))
