"""SuccessPredictor: features, cold start, calibration metrics, online learning, checkpoints."""

from __future__ import annotations

import math
import random

import pytest
import torch
from alloc_trees import add_chain, answer_turn, invalid_turn, tool_turn, toy_step
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.allocation.features import FEATURE_NAMES
from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor, weighted_auc
from tracerl.core.types import RolloutTree


def _feature(pred: SuccessPredictor, tree: RolloutTree, node: int, name: str) -> float:
    return float(pred.features([tree], [node])[0, FEATURE_NAMES.index(name)])


def _two_chain_tree(task: str = "q1") -> RolloutTree:
    """root -> search -> answer (r=1) and root -> search -> answer (r=0)."""
    tree = RolloutTree("t", task, prompt_ids=[1, 2, 3])
    add_chain(tree, 0, [tool_turn(), answer_turn()], 1.0)
    add_chain(tree, 0, [tool_turn(), answer_turn()], 0.0)
    return tree


def test_features_read_the_history() -> None:
    tree = RolloutTree("t", "q1", prompt_ids=[1] * 9)
    turns = [tool_turn("A: one."), tool_turn("Error", error=True), tool_turn("A: one."), invalid_turn(), answer_turn()]
    leaf = add_chain(tree, 0, turns, 1.0, readiness=[-2.0, -1.0, -1.0, -0.5, -0.5])
    pred = SuccessPredictor()
    n1, n2, n3, n4 = 1, 2, 3, 4
    assert _feature(pred, tree, n3, "depth") == pytest.approx(3 / 8)
    assert _feature(pred, tree, n3, "tool_calls") == pytest.approx(math.log1p(3))
    assert _feature(pred, tree, n2, "last_failed") == 1.0
    assert _feature(pred, tree, n3, "last_failed") == 0.0
    assert _feature(pred, tree, n4, "last_failed") == 1.0  # the invalid action
    assert _feature(pred, tree, n4, "errors") == pytest.approx(math.log1p(2))
    assert _feature(pred, tree, n3, "distinct_observations") == pytest.approx(math.log1p(1))  # "A" twice
    assert _feature(pred, tree, leaf, "is_answer") == 1.0
    assert _feature(pred, tree, 0, "prompt_length") == pytest.approx(math.log1p(9) / 4)
    # Readiness at S_2 (two transitions): l_2 = -1.0, V_2 = log((2 + 0.1) / (1 + 0.1)).
    assert _feature(pred, tree, n2, "readiness_present") == 1.0
    assert _feature(pred, tree, n2, "readiness") == pytest.approx(-1.0 / 10)
    assert _feature(pred, tree, n2, "readiness_value") == pytest.approx(math.log(2.1 / 1.1))
    assert _feature(pred, tree, 0, "readiness_present") == 0.0  # never at roots (stage 1 has none)
    assert _feature(pred, tree, n1, "seen_before") == 0.0


def test_cold_start_predicts_the_prior_then_the_prompt_table_fills() -> None:
    pred = SuccessPredictor()
    tree = _two_chain_tree()
    assert pred.predict_nodes([tree, tree], [0, 1]) == [0.5, 0.5]
    metrics = pred.update([tree])
    # Scored before training with the prior 0.5: nodes root (2 visits, target 0.5), two
    # search nodes and two leaves (1 visit, targets 1, 1, 0, 0): Brier = (0 + 4 * 0.25) / 6.
    assert metrics["n_nodes"] == 5
    assert metrics["brier"] == pytest.approx(1 / 6)
    assert metrics["auc"] == 0.5  # all tied
    assert metrics["prior"] == 0.5  # mean reward of the two leaves
    stats = pred.prompt_stats("q1")
    assert stats is not None and (stats.count, stats.rate) == (2, 0.5)
    assert _feature(pred, _two_chain_tree(), 0, "seen_before") == 1.0
    assert _feature(pred, _two_chain_tree(), 0, "seen_success_rate") == 0.5


def test_metrics_are_scored_before_the_step_is_learned() -> None:
    """The step's own outcomes must not leak into the features it is scored on."""
    pred = SuccessPredictor()
    rng = random.Random(0)
    pred.update(toy_step(rng, 0))
    step = toy_step(rng, 1)
    before = [pred.predict_nodes([t], [n.id])[0] for t in step for n in t.nodes]
    metrics = pred.update(step)
    expected = sum(
        n.visits * (p - n.value_target) ** 2  # type: ignore[operator]
        for p, n in zip(before, [n for t in step for n in t.nodes], strict=True)
    ) / sum(n.visits for t in step for n in t.nodes)
    assert metrics["brier"] == pytest.approx(expected, rel=1e-5)


def test_predictor_learns_a_task_agnostic_signal_on_unseen_prompts() -> None:
    pred = SuccessPredictor(PredictorConfig(seed=1))
    rng = random.Random(1)
    aucs = [pred.update(toy_step(rng, step))["auc"] for step in range(8)]
    assert aucs[0] == 0.5  # cold start: constant prior
    assert min(aucs[-3:]) > 0.85, aucs
    assert pred.updates == 8


def test_weighted_auc_hand_computed() -> None:
    # Positives: 1 at 0.9, 1 at 0.5. Negatives: 2 at 0.2, 1 at 0.5.
    # 0.9 beats all 3 negatives; 0.5 beats the two at 0.2 and ties one: (3 + 2.5) / (2 * 3).
    assert weighted_auc([0.9, 0.2, 0.5], [1, 0, 1], [0, 2, 1]) == pytest.approx(5.5 / 6)
    assert math.isnan(weighted_auc([0.3, 0.4], [1, 2], [0, 0]))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.1, 0.3, 0.5, 0.7]), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=8
    )
)
def test_weighted_auc_matches_pairwise_loop(items: list[tuple[float, int, int]]) -> None:
    pos = [s for s, w, _ in items for _ in range(w)]
    neg = [s for s, _, f in items for _ in range(f)]
    got = weighted_auc([s for s, _, _ in items], [w for _, w, _ in items], [f for _, _, f in items])
    if not pos or not neg:
        assert math.isnan(got)
        return
    slow = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))
    assert got == pytest.approx(slow)


def test_state_dict_round_trip_resumes_exactly(tmp_path) -> None:
    cfg = PredictorConfig(batch_size=16, buffer_size=100, seed=3)
    rng = random.Random(2)
    steps = [toy_step(rng, s) for s in range(4)]
    a = SuccessPredictor(cfg)
    for trees in steps[:2]:
        a.update(trees)
    torch.save(a.state_dict(), tmp_path / "pred.pt")
    b = SuccessPredictor(cfg)
    b.load_state_dict(torch.load(tmp_path / "pred.pt", weights_only=False))
    for trees in steps[2:]:
        assert a.update(trees) == b.update(trees)
    probe = toy_step(random.Random(9), 99)
    ids = [(t, n.id) for t in probe for n in t.nodes]
    assert a.predict_nodes([t for t, _ in ids], [i for _, i in ids]) == b.predict_nodes(
        [t for t, _ in ids], [i for _, i in ids]
    )
    assert a.state_dict()["buffer"]["y"].numel() == 100  # bounded replay buffer


def test_prompt_table_is_bounded() -> None:
    pred = SuccessPredictor(PredictorConfig(prompt_table_size=3))
    pred.update([_two_chain_tree(f"q{i}") for i in range(5)])
    assert pred.prompt_stats("q0") is None and pred.prompt_stats("q4") is not None


@pytest.mark.parametrize(
    "field,value",
    [("hidden", -1), ("lr", 0.0), ("steps_per_update", 0), ("buffer_size", 0), ("train_nodes", "leaves")],
)
def test_bad_config_is_rejected(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        PredictorConfig(**{field: value})  # type: ignore[arg-type]


def test_load_state_dict_rejects_a_different_model() -> None:
    state = SuccessPredictor(PredictorConfig(hidden=8)).state_dict()
    with pytest.raises(ValueError, match="hidden"):
        SuccessPredictor(PredictorConfig(hidden=16)).load_state_dict(state)
