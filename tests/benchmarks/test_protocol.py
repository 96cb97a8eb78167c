"""The comparison protocol: paired differences by seed, bootstrap intervals, collapse, the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import protocol  # noqa: E402
import sample_efficiency as se  # noqa: E402


def run(seed: int, sampled: float, base: float = 0.1, greedy: float = 0.2, rewards: list[float] | None = None,
        eff: float = 0.5, hop2: float = 0.3) -> dict:
    return {"seed": seed, "sampled": {"all": sampled, "1": sampled + 0.1, "2": sampled - 0.1},
            "sampled_base": {"all": base}, "final": {"unseen": greedy},
            "final_by_hops": {"unseen": {"1": greedy, "2": greedy / 2}},
            "reward_mean": rewards if rewards is not None else [0.5] * 10, "effective_ratio": [eff],
            "hop_share": {"1": 1 - hop2, "2": hop2}}


def test_bootstrap_of_equal_differences_is_a_point_and_needs_two_seeds() -> None:
    assert protocol.paired_bootstrap([0.02, 0.02, 0.02]) == {"mean": 0.02, "lo": 0.02, "hi": 0.02, "n": 3}
    assert protocol.paired_bootstrap([0.05]) == {"mean": 0.05, "lo": None, "hi": None, "n": 1}
    assert protocol.paired_bootstrap([])["n"] == 0
    got = protocol.paired_bootstrap([-0.1, 0.1, 0.3, 0.5])
    assert got["mean"] == pytest.approx(0.2) and -0.1 <= got["lo"] < 0.2 < got["hi"] <= 0.5
    assert got == protocol.paired_bootstrap([-0.1, 0.1, 0.3, 0.5])  # seeded


def test_deltas_pair_by_seed() -> None:
    arm, base = [run(0, 0.3), run(2, 0.5)], [run(0, 0.2), run(1, 0.9), run(2, 0.4)]
    assert protocol.paired_deltas(arm, base, lambda r: r["sampled"]["all"]) == pytest.approx([0.1, 0.1])


def test_collapse_rule() -> None:
    assert not protocol.collapsed(run(0, 0.3))
    assert protocol.collapsed(run(0, 0.3, rewards=[0.4] + [0.0] * 10))  # no reward on the last 10 steps
    assert protocol.collapsed(run(0, 0.04, base=0.1))  # below half the base model's sampled success
    assert not protocol.collapsed(run(0, 0.05, base=0.1))


def test_summary_and_table() -> None:
    grpo = [run(0, 0.2, eff=0.25, hop2=0.5), run(1, 0.3, eff=0.25, hop2=0.5)]
    arm = [run(0, 0.25, eff=0.5), run(1, 0.33, rewards=[0.0] * 10, eff=0.5)]
    got = se.protocol_summary(arm, grpo)
    assert got["collapses"] == 1
    assert got["sampled_by_hops"]["all"]["mean"] == pytest.approx(0.29)
    assert got["paired_vs_grpo"]["sampled_all"]["mean"] == pytest.approx(0.04)
    assert got["paired_vs_grpo"]["sampled_2"]["n"] == 2
    assert got["hop_share_mean"] == {"1": pytest.approx(0.7), "2": pytest.approx(0.3)}
    methods = {"grpo": {"seeds": 2, **se.protocol_summary(grpo, grpo)}, "arm": {"seeds": 2, **got}}
    table = protocol.protocol_table("x", {"methods": methods, "setting": {"sampled_samples": 4, "sampled_questions": 300}})
    assert "| arm | 2 | 29.0 ± 5.7% |" in table and "+4.0 [+3.0, +5.0] (n 2)" in table


def test_merge_keeps_one_of_identical_twins_and_rejects_different_ones(tmp_path) -> None:
    import json

    def shard(name: str, runs: dict) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"setting": {"seeds": 1}, "runs": runs, "seconds": 1.0}))
        return path

    a = shard("a.json", {"grpo": [run(0, 0.2)], "trace_alloc": [run(0, 0.3)]})
    b = shard("b.json", {"grpo": [run(0, 0.2)], "trace_alloc_coverage": [run(0, 0.25)]})
    runs, _ = se.merge_shards([a, b])
    assert [len(runs[m]) for m in ("grpo", "trace_alloc", "trace_alloc_coverage")] == [1, 1, 1]
    c = shard("c.json", {"grpo": [run(0, 0.9)]})
    with pytest.raises(SystemExit, match="grpo seed 0 differs"):
        se.merge_shards([a, c])
