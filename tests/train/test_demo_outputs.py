"""The demo's outputs (issue 51 items 2, 8, 14): a new run folder each time and never a foreign
folder, 80-column step lines with an ETA, warnings as one line once per run, curves with the
base point and the final evaluation, torch threads for the free cores."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from tracerl.busy_cores import busy_shares, count_free, cpu_times, passive_wait
from tracerl.runs.console import progress_line
from tracerl.runs.warn_console import one_line, warning_key, warnings_to_console
from tracerl.train.demo import DEMO_OVERRIDES, MAX_STEPS, step_printer
from tracerl.train.demo_folder import MARK, DemoFolderError, claim
from tracerl.view.plot import figure, final_point, _with_costs


# --- item 2: never delete or mix ----------------------------------------------------------------


def test_each_demo_gets_a_new_run_folder_and_the_first_is_left_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "demo_out"
    first = claim(out)
    assert (first.run, first.summary, first.curves) == (out / "run", out / "summary.json", out / "curves.png")
    (first.run / "metrics.jsonl").write_text('{"step": 1}\n')
    first.summary.write_text("{}\n")
    second = claim(out)
    assert (second.run, second.summary, second.curves) == (out / "run-2", out / "summary-2.json", out / "curves-2.png")
    assert (first.run / "metrics.jsonl").read_text() == '{"step": 1}\n' and first.summary.read_text() == "{}\n"
    assert claim(out).run == out / "run-3"
    assert (out / MARK).is_file()


def test_a_demo_folder_of_before_the_mark_counts_as_one(tmp_path: Path) -> None:
    """What ``tracerl demo`` wrote before: run/, unseen_world/, summary.json, curves.png."""
    for name in ("run", "unseen_world"):
        (tmp_path / name).mkdir()
    (tmp_path / "summary.json").write_text("{}")
    assert claim(tmp_path).run == tmp_path / "run-2"


def test_a_folder_that_is_not_a_demos_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(DemoFolderError, match=r"is not empty \(thesis.tex, \.\.\.\) and is not a tracerl demo folder"):
        claim(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DemoFolderError, match="is a file"):
        claim(tmp_path / "afile")


def test_the_demo_refuses_a_foreign_out_before_loading_anything(tmp_path: Path) -> None:
    from tracerl.train.demo import run_demo

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    console = Console(file=(tmp_path / "console.txt").open("w"))
    with pytest.raises(DemoFolderError, match="not a tracerl demo folder"):
        run_demo(out, train_minutes=0.01, console=console)
    console.file.close()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_summary_left_without_its_run_folder_is_not_overwritten(tmp_path: Path) -> None:
    claim(tmp_path)
    (tmp_path / "summary-2.json").write_text("kept")  # e.g. run-2 moved elsewhere by hand
    assert claim(tmp_path).run == tmp_path / "run-3"
    assert (tmp_path / "summary-2.json").read_text() == "kept" and not (tmp_path / "run-2").exists()


# --- item 13: bounded by steps ---------------------------------------------------------------------


def test_the_demo_is_bounded_by_steps_and_rolls_back_a_blow_up() -> None:
    assert f"steps={MAX_STEPS}" in DEMO_OVERRIDES and MAX_STEPS <= 100
    assert "optim.divergence.mode=rollback" in DEMO_OVERRIDES
    assert "algo.advantage.credit_centre=gated" in DEMO_OVERRIDES


# --- item 8: step lines, warnings, curves --------------------------------------------------------


def test_the_step_line_fits_80_columns_and_its_eta_is_the_sooner_bound() -> None:
    record = {"step": 10, "reward_mean": 0.5, "effective_ratio": 0.375, "loss": -0.12, "generated_tokens": 1755,
              "generated_tokens_per_s": 2929.006, "step_seconds": 1.461, "eval_accuracy": 0.22}
    # 10 of 100 steps in 30 s: 90 more at 3 s is 4:30; the budget has 60 s left: ETA 1:00
    line = progress_line(record, 100, 30.0, 10, 80, time_left=60.0)
    assert line == "step 10/100  0:30 ETA 1:00  eval 0.220  reward 0.500  mixed 0.375  loss -0.120"
    assert progress_line(record, 100, 30.0, 10, 80, time_left=600.0).startswith("step 10/100  0:30 ETA 4:30  ")
    assert progress_line(record, 100, 30.0, 10, 80, time_left=-5.0).startswith("step 10/100  0:30 ETA 0:00  ")


def test_the_demo_prints_one_step_line_per_step(tmp_path: Path) -> None:
    console = Console(file=(tmp_path / "out.txt").open("w"), width=80)
    echo = step_printer(console, 100, deadline=1e12, width=80)
    echo({"step": 1, "reward_mean": 0.008, "effective_ratio": 0.125, "loss": 0.045, "rollouts": 128,
          "generated_tokens": 7275, "generated_tokens_per_s": 1183.185, "step_seconds": 13.792})
    console.file.close()
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80 and lines[0].startswith("step 1/100  ")
    assert lines[0].endswith("reward 0.008  mixed 0.125  loss 0.045") and "generated_tokens" not in lines[0]


STARVING = ("stratum hops2: {share} of the trained prompts over the last 10 steps while the pool offers {pool}; "
            "stage 1 is starving it (see rollout.schemes.trace_floor_per_prompt / trace_root_mode / "
            "trace_explore_fraction)")


def test_a_repeated_warning_is_one_line_once_per_run() -> None:
    lines: list[str] = []
    with warnings_to_console(lines.append, 80) as shown:
        for share, pool in (("0.0%", "49%"), ("2.5%", "51%"), ("0.0%", "49%")):
            warnings.warn(STARVING.format(share=share, pool=pool), UserWarning, stacklevel=1)
        warnings.warn("stratum hops1: 0.0% of the trained prompts", UserWarning, stacklevel=1)  # another stratum
    assert lines == [one_line(STARVING.format(share="0.0%", pool="49%"), 80),
                     "warning: stratum hops1: 0.0% of the trained prompts"]
    assert len(lines[0]) == 80 and lines[0].endswith("...")
    assert shown[0] == STARVING.format(share="0.0%", pool="49%")  # the full text is kept for the summary
    assert warning_key(UserWarning, "hops2: 0.0% of 10") == warning_key(UserWarning, "hops2: 2.5% of 12")
    assert warning_key(UserWarning, "hops2: 1%") != warning_key(UserWarning, "hops1: 1%")


def test_warnings_show_as_before_outside_the_block() -> None:
    before = warnings.showwarning
    with warnings_to_console(lambda _line: None, 80):
        pass
    assert warnings.showwarning is before


def write_run(run: Path) -> None:
    run.mkdir()
    records = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "eval_accuracy": 0.003},
               {"step": 1, "rollouts": 128, "generated_tokens": 1000, "reward_mean": 0.1, "loss": 0.0},
               {"step": 2, "rollouts": 128, "generated_tokens": 3000, "reward_mean": 0.2, "loss": 0.0,
                "eval_accuracy": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_curves_start_at_the_base_point_and_end_on_the_final_evaluation(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    final = {"step": 2, "eval_accuracy": 0.193, "label": "final evaluation (300 questions)"}
    fig = figure([tmp_path / "run"], ["trace"], 0.0, [final])
    tokens_panel, rollouts_panel = fig.axes[0], fig.axes[1]
    curve, star = tokens_panel.lines
    assert list(curve.get_xdata()) == [0, 4000] and list(curve.get_ydata()) == [0.003, 0.2]  # base, step 2
    assert (list(star.get_xdata()), list(star.get_ydata()), star.get_marker()) == ([4000], [0.193], "*")
    assert star.get_label() == "final evaluation (300 questions)"
    assert list(rollouts_panel.lines[1].get_xdata()) == [256]
    records = _with_costs([{"step": 0, "rollouts": 0, "generated_tokens": 0}, {"step": 1, "rollouts": 2,
                                                                               "generated_tokens": 5}])
    assert final_point(records, {"step": 1, "eval_accuracy": 0.5}) == {"tokens": 5, "cum_rollouts": 2,
                                                                        "eval_accuracy": 0.5}
    assert final_point(records, {"step": 7, "eval_accuracy": 0.5}) is None


# --- item 14: threads for the free cores -----------------------------------------------------------

STAT_BEFORE = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 350 0 0 0 0 0 0
cpu1 200 0 50 250 0 0 0 0 0 0
intr 1 2 3
"""
STAT_AFTER = """cpu  440 0 110 650 0 0 0 0 0 0
cpu0 110 0 50 390 0 0 0 0 0 0
cpu1 330 0 60 260 0 0 0 0 0 0
"""


def test_free_cores_from_two_proc_stat_readings() -> None:
    """cpu0: 10 of 50 jiffies busy (0.2); cpu1: 140 of 150 busy (0.93): one core is free."""
    before, after = cpu_times(STAT_BEFORE), cpu_times(STAT_AFTER)
    assert before == {0: (150, 500), 1: (250, 500)}
    shares = busy_shares(before, after)
    assert shares == pytest.approx({0: 0.2, 1: 140 / 150})
    assert count_free(shares, {0, 1}) == 1
    assert count_free(shares, {1}) == 1  # never 0 threads
    assert count_free({0: 0.1, 1: 0.3}, {0, 1}) == 2


def test_passive_wait_keeps_a_policy_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch  # noqa: F401 - OpenMP has started: passive_wait can no longer act in this process

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert passive_wait() is False
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
