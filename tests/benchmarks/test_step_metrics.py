"""Episode statistics of finished runs from their step records, with hand-computed figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import step_metrics  # noqa: E402


def record(step: int, episodes: int, calls: int, turns: float, flip: float | None = None, ratio: float = 0.0) -> dict:
    return {"step": step, "trajectories": episodes, "tool_calls": calls, "turns_mean": turns,
            "effective_ratio": ratio, "credit_mixed_flip_share": flip}


RECORDS = [record(1, 4, 10, 3.0, 0.25, 0.5), record(2, 4, 6, 5.0, None), record(3, 8, 8, 2.0, 0.0, 0.25)]


def test_per_episode_weighs_each_step_by_its_episodes() -> None:
    # calls (10 + 6 + 8) / 16; turns (4*3 + 4*5 + 8*2) / 16 = 48 / 16 (the unweighted mean would be 3.33)
    assert step_metrics.per_episode(RECORDS) == {"tool_calls_executed": 1.5, "turns": 3.0}
    assert step_metrics.per_episode([]) == {"tool_calls_executed": None, "turns": None}
    # 4 of step 3's 8 episodes failed in the infrastructure: its turns_mean covers 4, so turns are
    # (4*3 + 4*5 + 4*2) / 12 = 40 / 12 (weighing by all 16 would give 3.0); calls still divide by 16
    failed = [*RECORDS[:2], {**RECORDS[2], "infra_failed": 4}]
    got = step_metrics.per_episode(failed)
    assert got["tool_calls_executed"] == 1.5 and got["turns"] == pytest.approx(40 / 12)


def test_flips_count_only_steps_with_mixed_transitions() -> None:
    records = [*RECORDS, record(4, 4, 4, 1.0, float("nan"))]
    # defined on steps 1 and 3 (0.25, 0.0); step 2 null, step 4 NaN
    assert step_metrics.flips(records) == {"steps_with_mixed_transitions": 2, "mean_share": 0.125, "steps_with_a_flip": 1}
    no_mixed = [record(1, 4, 4, 1.0, None)]
    assert step_metrics.flips(no_mixed) == {"steps_with_mixed_transitions": 0, "mean_share": None, "steps_with_a_flip": 0}
    grpo = [{k: v for k, v in r.items() if k != "credit_mixed_flip_share"} for r in RECORDS]
    assert step_metrics.flips(grpo) is None


def test_first_and_last_windows() -> None:
    # 12 steps of 2 episodes: steps 1-6 make 1 call an episode, 7-12 make 3
    records = [record(s, 2, 2 if s <= 6 else 6, 2.0) for s in range(1, 13)]
    got = step_metrics.summarise(records)
    assert got["steps"] == 12
    assert got["per_episode"]["tool_calls_executed"] == 2.0
    assert got["per_episode_first"]["tool_calls_executed"] == pytest.approx((6 * 1 + 4 * 3) / 10)  # steps 1-10
    assert got["per_episode_last"]["tool_calls_executed"] == pytest.approx((4 * 1 + 6 * 3) / 10)  # steps 3-12


def run_dir(tmp_path: Path, steps: int) -> Path:
    run = tmp_path / "trace_credit-seed3"
    run.mkdir()
    (run / "config.yaml").write_text(f"preset: trace_credit\nsteps: {steps}\nseed: 3\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return run


def test_script_writes_each_finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["step_metrics.py", "--runs", str(run_dir(tmp_path, 3)), "--out", str(out)])
    step_metrics.main()
    (got,) = json.loads(out.read_text())["runs"]
    assert (got["method"], got["seed"], got["steps"]) == ("trace_credit", 3, 3)
    assert got["per_episode"] == {"tool_calls_executed": 1.5, "turns": 3.0}
    assert got["effective_ratio_mean"] == 0.25


def test_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    run = run_dir(tmp_path, 150)
    with pytest.raises(SystemExit, match="3 step records, its config asks for 150"):
        step_metrics.read_run(run)
