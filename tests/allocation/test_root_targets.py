"""Stage-1-only root targets: the root learns the mean reward of the rollouts that started there,
not of the stage-2 continuations the allocator chose to buy."""

from __future__ import annotations

import pytest
from alloc_trees import add_chain, answer_turn, tool_turn

from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor
from tracerl.allocation.root_targets import root_rollout_rewards
from tracerl.core.types import RolloutTree


def tree() -> RolloutTree:
    # root rollout A succeeds; two stage-2 continuations from A's first boundary fail; rollout B fails.
    t = RolloutTree("t", "task", prompt_ids=[1, 2, 3])
    add_chain(t, 0, [tool_turn(), answer_turn()], 1.0)
    add_chain(t, 0, [tool_turn(), answer_turn()], 0.0)
    anchor = t.root.children[0]
    add_chain(t, anchor, [answer_turn()], 0.0)
    add_chain(t, anchor, [answer_turn()], 0.0)
    return t


def test_root_rollout_rewards_follow_first_children() -> None:
    assert root_rollout_rewards(tree()) == [1.0, 0.0]


def test_root_target_and_weight_by_option() -> None:
    def root_row(option: str) -> tuple[float, float]:
        pred = SuccessPredictor(PredictorConfig(root_targets=option))
        trees, ids, y, w, _, _ = pred._step_nodes([tree()])
        row = ids.index(0)
        return float(y[row]), float(w[row])

    assert root_row("backup") == (pytest.approx(0.25), 4.0)  # the spec's backup: 1 of 4 leaves
    assert root_row("stage1") == (pytest.approx(0.5), 2.0)  # 1 of the 2 root rollouts


def test_option_is_validated() -> None:
    with pytest.raises(ValueError, match="root_targets must be one of backup, stage1"):
        PredictorConfig(root_targets="recent")
