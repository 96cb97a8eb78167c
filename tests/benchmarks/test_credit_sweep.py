"""credit_sweep's shard bookkeeping: grids united on merge, twins checked, paired deltas, job claims."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import credit_sweep as cs  # noqa: E402

CENTER = cs.label(*cs.CENTER)
K1 = cs.label(1, 0.2, "log_ratio")
W0 = cs.label(3, 0.0, "log_ratio")
SETTING = {"preset": "trace_credit", "steps": 10, "seeds": 1}


def _point(name: str, horizon: int, w_turn: float, axes: list[str]) -> dict:
    return {"label": name, "horizon": horizon, "w_turn": w_turn, "credit_value": "log_ratio", "axes": axes}


def _run(seed: int, unseen: float) -> dict:
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.1},
             {"step": 10, "rollouts": 640, "generated_tokens": 1000 + seed, "accuracy": unseen}]
    return {"seed": seed, "curve": curve, "final": {"unseen": unseen, "train": unseen + 0.1, "redrawn": None},
            "final_by_hops": {"unseen": {"1": unseen}}, "effective_ratio": [0.5], "reward_mean": [0.1],
            "step_seconds": [1.0]}


def _shard(path: Path, grid: list[dict], runs: dict[str, list[dict]], setting: dict | None = None) -> Path:
    path.write_text(json.dumps({"grid": grid, "runs": runs, "setting": setting or SETTING, "seconds": 5.0,
                                "quick": False, "machine": "m", "python": "3", "torch": "t", "threads": 1,
                                "cpus": 2}))
    return path


def test_merge_unites_grids_and_keeps_one_of_identical_twins(tmp_path: Path) -> None:
    center = _point(CENTER, 3, 0.2, ["horizon", "w_turn", "credit_value"])
    a = _shard(tmp_path / "a.json", [center, _point(K1, 1, 0.2, ["horizon"])],
               {CENTER: [_run(1, 0.225)], K1: [_run(1, 0.23)]})
    b = _shard(tmp_path / "b.json", [center, _point(W0, 3, 0.0, ["w_turn"])],
               {CENTER: [_run(1, 0.225), _run(2, 0.30)], W0: [_run(1, 0.325)]})
    runs, merged = cs.merge_shards([a, b])
    assert [p["label"] for p in merged["grid"]] == [CENTER, K1, W0]
    assert [r["seed"] for r in runs[CENTER]] == [1, 2]  # seed 1's twin kept once
    assert merged["setting"]["seeds"] == 2 and merged["setting"]["seed_list"] == [1, 2]
    assert merged["seconds"] == 10.0
    points = cs.summarise(merged["grid"], runs)
    assert points[CENTER]["final_accuracy_mean"] == pytest.approx(0.2625)  # (0.225 + 0.30) / 2
    assert points[CENTER]["final_accuracy_by_hops"]["1"]["mean"] == pytest.approx(0.2625)
    assert points[CENTER]["late_tokens_per_step_mean"] == pytest.approx((1001 / 10 + 1002 / 10) / 2)
    # W0 ran seed 1 only: the plain delta compares it with the two-seed centre mean, the paired one with seed 1's
    assert points[W0]["delta_vs_center"] == pytest.approx(0.325 - 0.2625)
    assert points[W0]["delta_vs_center_paired"] == pytest.approx(0.10)
    assert points[W0]["paired_seeds"] == 1 and points[W0]["delta_vs_center_paired_std"] is None
    assert points[CENTER]["delta_vs_center_paired"] == pytest.approx(0.0) and points[CENTER]["paired_seeds"] == 2
    # against w_turn = 0 (GRPO): the centre's seed 1 is 0.10 below, and only seed 1 is shared
    assert points[CENTER]["delta_vs_grpo_paired"] == pytest.approx(-0.10)
    assert points[CENTER]["delta_vs_grpo_paired_below"] == 1 and points[CENTER]["paired_seeds_grpo"] == 1


def test_merge_refuses_twins_that_differ_and_settings_that_differ(tmp_path: Path) -> None:
    center = _point(CENTER, 3, 0.2, ["horizon", "w_turn", "credit_value"])
    a = _shard(tmp_path / "a.json", [center], {CENTER: [_run(1, 0.225)]})
    b = _shard(tmp_path / "b.json", [center], {CENTER: [_run(1, 0.250)]})
    with pytest.raises(SystemExit, match="different results"):
        cs.merge_shards([a, b])
    c = _shard(tmp_path / "c.json", [center], {CENTER: [_run(2, 0.2)]}, {**SETTING, "steps": 20})
    with pytest.raises(SystemExit, match="setting differs"):
        cs.merge_shards([a, c])


def test_done_runs_and_claims(tmp_path: Path) -> None:
    a = _shard(tmp_path / "a.json", [], {CENTER: [_run(1, 0.2)], K1: [_run(1, 0.2), _run(2, 0.3)]})
    assert cs.done_runs([a]) == {(CENTER, 1), (K1, 1), (K1, 2)}
    assert cs.claim(None, CENTER, 0)  # no claim folder: every job is this queue's
    claims = tmp_path / "claims"
    assert cs.claim(claims, CENTER, 0)
    assert not cs.claim(claims, CENTER, 0)  # a second queue finds it taken
    assert cs.claim(claims, CENTER, 1) and cs.claim(claims, K1, 0)


def test_sweep_skips_done_and_claimed_jobs_and_saves_after_each_run(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    trained: list[tuple[str, int]] = []

    def fake_run_one(preset: str, seed: int, overrides: list[str], args: argparse.Namespace, base: dict) -> dict:
        trained.append((next(o for o in overrides if o.startswith("algo.advantage.horizon=")), seed))
        return _run(seed, 0.1)

    monkeypatch.setattr(cs, "run_one", fake_run_one)
    monkeypatch.setattr(cs, "configure_torch", lambda threads: None)
    points = [_point(CENTER, 3, 0.2, []), _point(K1, 1, 0.2, [])]
    done = _shard(tmp_path / "done.json", points, {CENTER: [_run(1, 0.2)]})
    claims = tmp_path / "claims"
    assert cs.claim(claims, K1, 2)  # another queue holds this job
    args = argparse.Namespace(threads=1, smoke=True, quick=True, hard=False, setting="bench", overrides=[],
                              dev_model=False, steps=3, final_eval=4, grid="cross", seed_list=[1, 2], skip_from=[done],
                              claim_dir=claims, work_dir=tmp_path / "work", sampled_eval=0, samples=1)
    saves: list[int] = []
    runs, setting = cs.sweep(args, points, lambda runs, setting: saves.append(sum(map(len, runs.values()))))
    assert trained == [("algo.advantage.horizon=1", 1), ("algo.advantage.horizon=3", 2)]
    assert saves == [1, 2]
    assert [r["seed"] for r in runs[CENTER]] == [2] and [r["seed"] for r in runs[K1]] == [1]
    assert setting["preset"] == "trace_credit" and setting["steps"] == 3


def test_merge_imports_a_sample_efficiency_sweep_as_centre_and_w_turn_zero(tmp_path: Path) -> None:
    knobs = {k: 1 for k in cs.SAME_KNOBS}
    center = _point(CENTER, 3, 0.2, ["horizon", "w_turn", "credit_value"])
    shard = _shard(tmp_path / "s.json", [center, _point(K1, 1, 0.2, ["horizon"])],
                   {CENTER: [_run(1, 0.225)], K1: [_run(1, 0.23)]}, {**knobs, "grid_kind": "cross", "seeds": 1})
    sweep = tmp_path / "sample_efficiency.json"
    sweep.write_text(json.dumps({"methods": {}, "setting": {**knobs, "name": "bench", "seeds": 2},
                                 "runs": {"trace_credit": [_run(0, 0.0), _run(1, 0.225)],
                                          "grpo": [_run(0, 0.31), _run(1, 0.325)], "dapo": [_run(0, 0.9)]}}))
    assert cs.done_runs([sweep]) == {(CENTER, 0), (CENTER, 1), (W0, 0), (W0, 1)}  # dapo is no point of the grid
    runs, merged = cs.merge_shards([shard], [sweep])
    assert [r["seed"] for r in runs[CENTER]] == [0, 1] and [r["final"]["unseen"] for r in runs[W0]] == [0.31, 0.325]
    assert [p["label"] for p in merged["grid"]] == [CENTER, K1, W0]
    assert merged["grid"][2]["axes"] == ["w_turn"]
    assert merged["setting"]["imported"] == {"sample_efficiency.json": cs.IMPORTED}
    points = cs.summarise(merged["grid"], runs)
    assert points[W0]["delta_vs_center_paired"] == pytest.approx(((0.31 - 0.0) + (0.325 - 0.225)) / 2)
    assert points[K1]["delta_vs_center_paired"] == pytest.approx(0.005) and points[K1]["paired_seeds"] == 1
    # a sweep in another setting lends nothing
    sweep.write_text(json.dumps({"methods": {}, "setting": {**knobs, "lr": 3e-4}, "runs": {"grpo": [_run(0, 0.3)]}}))
    with pytest.raises(SystemExit, match="differs .* in lr"):
        cs.merge_shards([shard], [sweep])
