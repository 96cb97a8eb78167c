"""Per-stratum shares of the trained prompts, and the warning when stage 1 starves a stratum."""

from __future__ import annotations

import warnings

import pytest
from alloc_trees import add_chain, answer_turn, tool_turn

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions
from tracerl.core.types import RolloutTree, Task
from tracerl.runs.trace_metrics import TraceMetrics

TASKS = {f"q{i}": Task(f"q{i}", "?", ("x",), hops=1 if i < 3 else 2) for i in range(4)}
POOL = list(TASKS.values())  # 3 one-hop prompts, 1 two-hop prompt


def trees(ids: list[str], rewards: list[float]) -> list[RolloutTree]:
    out = []
    for tid in ids:
        tree = RolloutTree(f"tree-{tid}", tid, prompt_ids=[1, 2])
        for r in rewards:
            add_chain(tree, 0, [tool_turn(), answer_turn()], r)
        out.append(tree)
    return out


def test_shares_and_success_per_hop() -> None:
    m = TraceMetrics("grpo", AdvantageOptions())
    step = trees(["q0", "q1"], [1.0, 0.0]) + trees(["q3"], [0.0, 0.0, 0.0, 0.0])
    got = m.observe(POOL, step, TASKS, AdvantageBatch([]))
    assert got["stratum_share_hops1"] == pytest.approx(2 / 3) and got["stratum_share_hops2"] == pytest.approx(1 / 3)
    assert got["stratum_rollouts_hops1"] == pytest.approx(4 / 8)
    assert got["stratum_success_hops1"] == 0.5 and got["stratum_success_hops2"] == 0.0
    assert "stratum_pred_hops1" not in got  # no predictor, no calibration


def test_a_starved_stratum_warns_once() -> None:
    m = TraceMetrics("grpo", AdvantageOptions(), window=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            got = m.observe(POOL, trees(["q0", "q1"], [1.0, 0.0]), TASKS, AdvantageBatch([]))
    assert got["stratum_share_hops2"] == 0.0
    starving = [w for w in caught if "stratum hops2" in str(w.message)]
    assert len(starving) == 1 and "pool offers 25%" in str(starving[0].message)
