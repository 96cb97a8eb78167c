"""Rollout schemes on a real engine: equal budgets, branch points, TRACE allocation wiring."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_trees import add_chain, answer_turn, tool_turn  # noqa: E402
from alloc_world import make_engine, make_env, shared  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.core.allocation import allocate_prefixes, allocate_roots  # noqa: E402
from tracerl.core.types import RolloutTree  # noqa: E402
from tracerl.agent.formats import encode_prompt  # noqa: E402
from tracerl.rollout.executor import LocalExecutor  # noqa: E402
from tracerl.allocation.schemes import (  # noqa: E402
    SCHEME_NAMES,
    SchemeConfig,
    effective_ratio,
    expandable_nodes,
    get_scheme,
)

BUDGET = 32


@pytest.fixture(scope="module")
def setup():
    w, env, policy = shared()
    return w, make_engine(policy, env)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assistant_tokens(trees: list[RolloutTree]) -> int:
    return sum(len(n.turn.assistant_ids) for t in trees for n in t.nodes if n.turn is not None)


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_every_scheme_spends_exactly_the_budget(setup, name: str) -> None:
    w, engine = setup
    result = get_scheme(name, SchemeConfig(), predictor=SuccessPredictor()).collect(LocalExecutor(engine), w.train, BUDGET, _gen())
    assert result.cost.rollouts == BUDGET
    leaves = sum(len(t.leaves()) for t in result.trees)
    if name == "dapo":  # dropped groups were sampled and paid for, but are not returned
        assert leaves + 8 * result.info["dropped_groups"] == BUDGET
        assert result.effective_ratio == (1.0 if result.trees else 0.0)
    else:
        assert leaves == BUDGET
        # Generated tokens count every sampled token once: a branch does not regenerate its prefix.
        assert result.cost.generated_tokens == _assistant_tokens(result.trees)
    for tree in result.trees:
        for leaf, traj in tree.trajectories.items():
            assert traj.token_ids == tree.prefix_ids(leaf)  # each leaf is its path through the tree


@pytest.mark.parametrize("name", ["tree_random", "trace"])
def test_branches_start_only_after_observations(setup, name: str) -> None:
    w, engine = setup
    result = get_scheme(name, SchemeConfig()).collect(LocalExecutor(engine), w.train, BUDGET, _gen(1))
    assert result.expansions
    branched = 0
    for tree in result.trees:
        for anchor in tree.branch_anchors():
            turn = tree.nodes[anchor].turn
            assert turn is not None and turn.is_transition and turn.observation_ids
            branched += 1
    assert branched > 0
    by_id = {t.tree_id: t for t in result.trees}
    for tree_id, node, _ in result.expansions:
        turn = by_id[tree_id].nodes[node].turn
        assert node == 0 or (turn is not None and turn.is_transition)


def test_uneven_budget_is_still_spent_exactly(setup) -> None:
    w, engine = setup
    assert get_scheme("tree_random").collect(LocalExecutor(engine), w.train, 19, _gen()).cost.rollouts == 19
    assert get_scheme("trace").collect(LocalExecutor(engine), w.train, 19, _gen()).cost.rollouts == 19


def test_trace_with_a_constant_predictor_allocates_uniformly(setup) -> None:
    w, engine = setup
    cfg = SchemeConfig(group_size=4)
    plain = get_scheme("trace", cfg).collect(LocalExecutor(engine), w.train, BUDGET, _gen(2))
    cold = get_scheme("trace", cfg, predictor=SuccessPredictor()).collect(LocalExecutor(engine), w.train, BUDGET, _gen(2))
    assert plain.expansions == cold.expansions
    assert [len(t.leaves()) for t in plain.trees] == [len(t.leaves()) for t in cold.trees]
    # Stage 1: 16 rollouts in groups of 4 on the first 4 prompts, in pool order.
    assert [t.task_id for t in plain.trees] == [t.id for t in w.train[:4]]
    assert all(len(t.root.children) == 4 for t in plain.trees)
    # Stage 2: every anchor gets the same number of continuations, up to one.
    counts = [k for _, node, k in plain.expansions if node != 0]
    anchors = int(plain.info["anchors"])
    per_anchor = counts + [0] * (anchors - len(counts))
    assert max(per_anchor) - min(per_anchor) <= 1
    assert plain.cost.rollouts == BUDGET


def _trained_predictor(w, engine) -> SuccessPredictor:
    """A predictor that has seen the first prompts with different outcomes (distinct root values)."""
    pred = SuccessPredictor()
    trees, _ = engine.rollout(w.train[:6], [6] * 6, generator=_gen(5))
    pred.update(trees)
    return pred


def test_trace_stages_follow_the_allocation_math(setup) -> None:
    w, engine = setup
    pred = _trained_predictor(w, engine)
    cfg = SchemeConfig(trace_max_per_anchor=2, trace_min_per_prompt=2)  # the spec's floor: pairs allowed
    pool = w.train[:8]
    prompts = [encode_prompt(engine.tokenizer, engine.fmt.render_prompt(t, engine.tools)) for t in pool]
    values = pred.predict_roots([t.id for t in pool], prompts)
    assert max(values) - min(values) > 1e-6
    counts = allocate_roots(values, BUDGET // 2)
    result = get_scheme("trace", cfg, predictor=pred).collect(LocalExecutor(engine), pool, BUDGET, _gen(6))
    chosen = [i for i, c in enumerate(counts) if c]
    assert [t.task_id for t in result.trees] == [pool[i].id for i in chosen]
    extra = {tid: 0 for tid in (t.tree_id for t in result.trees)}
    for tid, node, k in result.expansions:
        extra[tid] += k if node == 0 else 0  # root top-up, only when stage 2 had too few anchors
    assert [len(t.root.children) for t in result.trees] == [counts[i] + extra[f"{pool[i].id}@{i}"] for i in chosen]

    # Replay stage 1 with the same generator: the scheme's first engine call is exactly this one.
    ref, _ = engine.rollout(
        [pool[i] for i in chosen], [counts[i] for i in chosen],
        tree_ids=[f"{pool[i].id}@{i}" for i in chosen], generator=_gen(6),
    )
    anchors = [(t, nid) for t in ref for nid in expandable_nodes(t)]
    probs = pred.predict_nodes([t for t, _ in anchors], [nid for _, nid in anchors])
    rewards = []
    for tree, nid in anchors:
        leaf = nid
        while not tree.nodes[leaf].is_leaf:
            leaf = tree.nodes[leaf].children[0]
        rewards.append(tree.nodes[leaf].reward)
    ks = allocate_prefixes(probs, rewards, BUDGET - BUDGET // 2, max_per_anchor=2)
    expected = [(t.tree_id, nid, k) for (t, nid), k in zip(anchors, ks, strict=True) if k]
    stage2 = [e for e in result.expansions if e[1] != 0]
    assert sorted(stage2) == sorted(expected)
    assert result.cost.rollouts == BUDGET


def test_a_selected_prompt_gets_a_full_group_unless_told_otherwise(setup) -> None:
    assert SchemeConfig().min_per_prompt == 8
    assert SchemeConfig(group_size=4).min_per_prompt == 4
    assert SchemeConfig(group_size=4, trace_min_per_prompt=2).min_per_prompt == 2
    w, engine = setup
    pred = _trained_predictor(w, engine)
    result = get_scheme("trace", SchemeConfig(group_size=4), predictor=pred).collect(LocalExecutor(engine), w.train[:8], BUDGET, _gen(7))
    assert result.trees and all(len(t.root.children) >= 4 for t in result.trees)
    assert result.cost.rollouts == BUDGET


def test_trace_spends_budget_without_anchors_on_root_rollouts() -> None:
    w, _, policy = shared()
    engine = make_engine(policy, make_env(w, max_turns=1), max_turns=1)  # one turn: no boundaries
    result = get_scheme("trace").collect(LocalExecutor(engine), w.train, 20, _gen())
    assert result.info["anchors"] == 0
    assert result.info["root_topup"] == 10
    assert result.cost.rollouts == 20 and sum(len(t.leaves()) for t in result.trees) == 20


def test_dapo_with_a_target_stops_early_and_counts_every_wave(setup) -> None:
    w, engine = setup
    cfg = SchemeConfig(group_size=4, dapo_target_groups=2)
    result = get_scheme("dapo", cfg).collect(LocalExecutor(engine), w.train, 64, _gen(3))
    assert len(result.trees) <= 2
    assert result.cost.rollouts == 4 * result.consumed <= 64
    assert result.info["dropped_groups"] + len(result.trees) <= result.consumed
    for tree in result.trees:
        assert len({traj.reward for traj in tree.trajectories.values()}) > 1


def test_effective_ratio_pools_trees_of_one_prompt() -> None:
    def tree(task: str, rewards: list[float]) -> RolloutTree:
        t = RolloutTree(f"{task}-{len(rewards)}", task, prompt_ids=[1])
        for r in rewards:
            add_chain(t, 0, [tool_turn(), answer_turn()], r)
        return t

    trees = [tree("a", [1.0, 0.0]), tree("b", [1.0, 1.0]), tree("c", [0.0]), tree("c", [1.0]), tree("d", [0.6, 0.5])]
    # a mixed, b all success, c mixed across its two trees, d mixed (0.6 > 0.5 >= 0.5): 3 of 4.
    assert effective_ratio(trees) == 0.75
    assert effective_ratio([]) == 0.0


def test_bad_requests_fail_clearly(setup) -> None:
    w, engine = setup
    with pytest.raises(ValueError, match="unknown rollout scheme .grpo.; valid: chain, dapo, trace, tree_random"):
        get_scheme("grpo")
    with pytest.raises(ValueError, match="multiple of group_size"):
        get_scheme("chain").collect(LocalExecutor(engine), w.train, 30)
    with pytest.raises(ValueError, match="pool holds 2"):
        get_scheme("chain").collect(LocalExecutor(engine), w.train[:2], 32)
    with pytest.raises(ValueError, match="trace_stage1_fraction"):
        SchemeConfig(trace_stage1_fraction=0.0)
    with pytest.raises(ValueError, match="trace_max_per_prompt"):
        SchemeConfig(trace_min_per_prompt=3, trace_max_per_prompt=2)
    with pytest.raises(ValueError, match="budget"):
        get_scheme("trace").collect(LocalExecutor(engine), w.train, 0)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(8, 40), fraction=st.sampled_from([0.25, 0.5, 1.0]), cap=st.sampled_from([None, 2, 3]))
def test_any_budget_is_spent_exactly(setup, budget: int, fraction: float, cap: int | None) -> None:
    w, engine = setup
    cfg = SchemeConfig(trace_stage1_fraction=fraction, trace_min_per_prompt=2, trace_max_per_prompt=cap, trace_rounds=2)
    for name in ("tree_random", "trace"):
        result = get_scheme(name, cfg).collect(LocalExecutor(engine), w.train, budget, _gen(budget))
        assert result.cost.rollouts == budget == sum(len(t.leaves()) for t in result.trees)
