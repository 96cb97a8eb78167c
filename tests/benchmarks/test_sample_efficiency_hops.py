"""Per-hop final accuracy in the sample-efficiency summary, and its survival through --merge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import sample_efficiency as se  # noqa: E402


def _run(seed: int, unseen: float, hops: dict[str, float]) -> dict:
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.0, "accuracy_by_hops": {"1": 0.0}},
             {"step": 10, "rollouts": 640, "generated_tokens": 1000, "accuracy": unseen, "accuracy_by_hops": hops}]
    return {"seed": seed, "curve": curve, "final": {"unseen": unseen, "train": unseen, "redrawn": None},
            "final_by_hops": {"unseen": hops}, "effective_ratio": [0.5], "reward_mean": [0.1], "step_seconds": [1.0]}


def test_hops_summary_mean_and_spread_per_hop() -> None:
    runs = [_run(0, 0.5, {"1": 0.9, "2": 0.3, "3": 0.1}), _run(1, 0.4, {"1": 0.7, "2": 0.5, "3": 0.1})]
    out = se.hops_summary(runs)
    assert list(out) == ["1", "2", "3"]
    assert out["1"]["mean"] == pytest.approx(0.8) and out["1"]["std"] == pytest.approx(0.1414213562)  # stdev(0.9, 0.7)
    assert out["2"]["mean"] == pytest.approx(0.4) and out["2"]["std"] == pytest.approx(0.1414213562)
    assert out["3"] == {"mean": pytest.approx(0.1), "std": pytest.approx(0.0), "seeds": 2}
    # one seed: no spread; a run without per-hop numbers (an old shard) is skipped
    old = {k: v for k, v in _run(2, 0.2, {}).items() if k != "final_by_hops"}
    assert se.hops_summary([runs[0], old])["2"] == {"mean": 0.3, "std": None, "seeds": 1}


def test_summary_and_merge_keep_final_accuracy_by_hops(tmp_path: Path) -> None:
    setting = {"steps": 10, "seeds": 1}
    shards = []
    for seed, hops in ((0, {"1": 1.0, "2": 0.2}), (1, {"1": 0.6, "2": 0.4})):
        path = tmp_path / f"shard{seed}.json"
        path.write_text(json.dumps({"setting": setting, "runs": {"grpo": [_run(seed, 0.5, hops)]}, "seconds": 5.0,
                                    "quick": False}))
        shards.append(path)
    runs, merged = se.merge_shards(shards)
    assert merged["setting"]["seeds"] == 2 and merged["seconds"] == 10.0
    summary = se.summarise(runs)
    by_hops = summary["methods"]["grpo"]["final_accuracy_by_hops"]
    assert by_hops["1"]["mean"] == pytest.approx(0.8) and by_hops["2"]["mean"] == pytest.approx(0.3)
    assert by_hops["2"]["std"] == pytest.approx(0.1414213562)
    assert summary["base_accuracy_by_hops"] == {"1": 0.0}
    assert summary["curves"]["grpo"][1]["accuracy_by_hops"] == {"1": pytest.approx(0.8), "2": pytest.approx(0.3)}


def test_a_preset_keeps_the_knob_it_changes_over_the_sweeps_base() -> None:
    extra = ["optim.lr=3e-4"]
    assert se.preset_overrides("grpo", se.BASE + extra) == se.BASE + extra
    kept = se.preset_overrides("grpo_4x16", se.BASE + se.QUICK + extra)
    assert "rollout.schemes.group_size=8" not in kept and "rollout.schemes.group_size=4" not in kept
    assert kept == [o for o in se.BASE + se.QUICK + extra if not o.startswith("rollout.schemes.group_size=")]
    config = se.resolve("grpo_4x16", kept, False)  # QUICK's budget 16: one prompt of 16
    assert (config.rollout.budget // config.rollout.schemes.group_size, config.rollout.schemes.group_size) == (1, 16)


def test_questions_per_hop_counts_the_first_held_out_questions() -> None:
    from tracerl.train.data import load_task_data

    setting = {"overrides": [], "smoke": True, "sampled_questions": 6, "final_eval_questions": 4}
    got = se.questions_per_hop(setting)
    config = se.resolve("grpo", [], True)
    held_out = load_task_data(config.data, config.rollout.engine, config.seed).held_out
    assert sum(got["sampled"].values()) == 6 and sum(got["greedy"].values()) == 4
    assert got["greedy"] == {h: sum(str(t.hops) == h for t in held_out[:4]) for h in got["greedy"]}
