"""The trace scheme and the trainer share one batched scoring call; nothing is scored twice."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_world import make_engine, shared  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.core.protocol import ScoreRequest, ScoreResult, score_requests  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.rollout.executor import LocalExecutor  # noqa: E402
from tracerl.allocation.schemes import SchemeConfig, get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402

BUDGET = 24


@pytest.fixture(scope="module")
def setup():
    w, env, policy = shared()
    return w, make_engine(policy, env)


def test_trace_scores_each_node_once_through_the_executor(setup) -> None:
    """The scheme asks after stage 1 and after each round; no node is requested twice, and every
    valid trajectory ends with readiness read off its boundary nodes."""
    w, engine = setup
    asked: list[tuple[str, int]] = []

    def score(requests: Sequence[ScoreRequest]) -> ScoreResult:
        result = ScoreResult()
        for req in requests:
            assert len(req.prefixes) == len(req.node_ids) and req.gold
            asked.extend((req.tree_id, n) for n in req.node_ids)
            result.nodes[req.tree_id] = {str(n): -float(n) for n in req.node_ids}
        return result

    cfg = SchemeConfig(group_size=4, trace_rounds=2)
    scheme = get_scheme("trace", cfg, predictor=SuccessPredictor(), score=True)
    result = scheme.collect(LocalExecutor(engine, score), w.train, BUDGET, torch.Generator().manual_seed(4))
    assert asked and len(asked) == len(set(asked))
    for tree in result.trees:
        for traj in tree.trajectories.values():
            if traj.readiness is not None:  # root top-up leaves stay for the trainer's call
                assert traj.readiness == [-float(n) for n in [traj.node_path[0]] + [
                    traj.node_path[i + 1] for i, t in enumerate(traj.turns) if t.is_transition]]


def test_trace_and_trainer_call_score_each_trajectory_once(setup) -> None:
    """With the real scorer: after the scheme, the trainer's call scores only what is left (the root
    top-up leaves' new nodes, if any), and every value equals the per-trajectory scorer's."""
    w, engine = setup
    scorer = ReferenceScorer(engine.backend.model, engine.tokenizer, engine.fmt)
    tasks = {t.id: t for t in w.train}
    session = RolloutSession(LocalExecutor(engine, scorer.score_nodes), seed=5)
    scheme = get_scheme("trace", SchemeConfig(group_size=4), predictor=SuccessPredictor(), score=True)
    result = scheme.collect(session, w.train, BUDGET)
    session.score(result.trees)  # the trainer's call
    assert score_requests(result.trees, tasks) == []  # a third call finds nothing to do
    for traj in (t for tree in result.trees for t in tree.trajectories.values()):
        if traj.infra_failed:
            assert traj.readiness is None
        else:
            assert traj.readiness == pytest.approx(scorer.readiness(traj, tasks[traj.task_id]), abs=1e-4)
