"""The trace scheme and the trainer share one batched scoring call; nothing is scored twice."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_world import make_engine, shared  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.core.types import RolloutTree, Task  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.rollout.schemes import SchemeConfig, get_scheme  # noqa: E402

BUDGET = 24


@pytest.fixture(scope="module")
def setup():
    w, env, policy = shared()
    return w, make_engine(policy, env)


def test_trace_scores_through_the_batched_callable(setup) -> None:
    """Each call gets the trees and the tasks; the scheme scores once after stage 1 and once per round."""
    w, engine = setup
    calls: list[int] = []

    def score(trees: Sequence[RolloutTree], tasks: Mapping[str, Task]) -> None:
        calls.append(sum(len(t.trajectories) for t in trees))
        for tree in trees:
            assert tree.task_id in tasks
            for traj in tree.trajectories.values():
                if traj.readiness is None and not traj.infra_failed:
                    traj.readiness = [-1.0] * (traj.num_transitions + 1)

    cfg = SchemeConfig(group_size=4, trace_rounds=2)
    scheme = get_scheme("trace", cfg, predictor=SuccessPredictor(), score=score)
    result = scheme.collect(engine, w.train, BUDGET, torch.Generator().manual_seed(4))
    assert len(calls) == 1 + cfg.trace_rounds
    assert calls[0] == result.info["stage1_rollouts"]
    assert calls == sorted(calls)  # later calls see the same trees, grown


def test_trace_and_trainer_call_score_each_trajectory_once(setup) -> None:
    """With the real scorer: after the scheme, the trainer's call scores only the root top-up leaves
    (if any), and every value equals the per-trajectory scorer's."""
    w, engine = setup
    scorer = ReferenceScorer(engine.backend.model, engine.tokenizer, engine.fmt)
    tasks = {t.id: t for t in w.train}
    scheme = get_scheme("trace", SchemeConfig(group_size=4), predictor=SuccessPredictor(), score=scorer.score)
    result = scheme.collect(engine, w.train, BUDGET, torch.Generator().manual_seed(5))
    trajectories = [t for tree in result.trees for t in tree.trajectories.values()]
    unscored = [t for t in trajectories if t.readiness is None and not t.infra_failed]
    stats = scorer.score(result.trees, tasks)
    assert stats.trajectories == len(unscored) and stats.requests <= len(unscored)
    assert scorer.score(result.trees, tasks).trajectories == 0  # a third call finds nothing to do
    for traj in trajectories:
        if traj.infra_failed:
            assert traj.readiness is None
        else:
            assert traj.readiness == pytest.approx(scorer.readiness(traj, tasks[traj.task_id]), abs=1e-4)
