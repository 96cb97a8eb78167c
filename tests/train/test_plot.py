"""Learning-curve plots: compact tick labels, EMA smoothing, the step-0 point, six panels, the reward caveat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.view.plot import _series, _with_costs, compact, ema, plot_runs


def test_compact_labels() -> None:
    assert [compact(v) for v in (0, 950, 1000, 100_000, 1_234_567, 2e9)] == ["0", "950", "1k", "100k", "1.2M", "2G"]


def test_ema_is_debiased_and_zero_is_identity() -> None:
    # s1 = 0.5 * 1 = 0.5, debiased /(1 - 0.5) -> 1.0; s2 = 0.5 * 0.5 + 0.5 * 0 = 0.25, /(1 - 0.25) -> 1/3
    assert ema([1.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3])
    assert ema([3.0, 1.0, 2.0], 0.0) == [3.0, 1.0, 2.0]
    assert ema([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # a constant stays constant
    with pytest.raises(ValueError, match="smooth"):
        ema([1.0], 1.0)


RECORDS = [
    {"step": 0, "eval_accuracy": 0.1, "generated_tokens": 0, "rollouts": 0},
    {"step": 1, "reward_mean": 0.2, "loss": 0.5, "generated_tokens": 600_000, "rollouts": 64, "effective_ratio": 0.5},
    {"step": 2, "reward_mean": 0.4, "loss": 0.3, "generated_tokens": 600_000, "rollouts": 64, "eval_accuracy": 0.3},
]


def test_the_step_zero_evaluation_is_the_first_point() -> None:
    records = _with_costs(RECORDS)
    assert _series(records, "tokens", "eval_accuracy") == ([0, 1_200_000], [0.1, 0.3])
    assert _series(records, "step", "reward_mean") == ([1, 2], [0.2, 0.4])  # step 0 has no training reward


def test_plot_writes_a_png_and_rejects_bad_smoothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = CliRunner().invoke(app, ["plot", str(run), "--out", str(tmp_path / "c.png"), "--smooth", "0.6"])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="--smooth must be in"):
        plot_runs([run], tmp_path / "d.png", smooth=1.5)


def test_the_training_reward_panel_says_accuracy_is_the_comparison(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: drawn.append(self))
    plot_runs([run], tmp_path / "c.png")
    (figure,) = drawn
    titles = {ax.get_title().split("\n")[0]: " ".join(ax.get_title().split()) for ax in figure.axes}
    assert titles["Training reward"] == ("Training reward (depends on which prompts were chosen: TRACE picks "
                                         "easier ones; compare held-out accuracy)")
    assert titles["Accuracy vs tokens"] == "Accuracy vs tokens"  # the comparison panels carry no caveat
