"""Divergence with finite weights: the tiny model at lr=1e30 (on main: exit 0 with a destroyed
model) stops with one line, or warns once; the monitor's tests and state by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.train import loop as loop_module
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.runs.divergence import DivergenceConfig, DivergenceError, DivergenceMonitor
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import read_metrics

CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3",
         "log.checkpoint_every=1", "log.rollouts=false"]


@pytest.fixture(autouse=True, scope="module")
def _pretrained() -> None:
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))


def config(*extra: str) -> TrainConfig:
    return resolve_config("grpo", smoke="random", overrides=[*CHEAP, *extra])


def test_lr_1e30_stops_when_the_policy_samples_noise(tmp_path: Path) -> None:
    """Step 1's update destroys the model: step 2's rollouts are uniform noise (entropy ln V)."""
    with Trainer(config("optim.lr=1e30", "steps=6", "optim.divergence.mode=stop"), tmp_path) as trainer, \
            pytest.raises(DivergenceError, match=r"training diverged at step 2: the sampled tokens' entropy rose to "
                                                 r"6\.\d+ nats, 1\d\d% of the uniform"):
        trainer.run()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]  # the diverged step's line is kept for the user to read
    assert records[0]["valid_action_rate"] > 0.5 and records[1]["valid_action_rate"] == 0.0
    assert (tmp_path / "LATEST").read_text() == "ckpt-000001"  # step 2 was not checkpointed


def test_lr_1e30_without_the_entropy_test_stops_at_the_collapse(tmp_path: Path) -> None:
    """Valid actions and reward 0 at steps 2, 3 and 4 (collapse_steps = 3) after a live step 1."""
    settings = ("optim.lr=1e30", "steps=8", "optim.divergence.mode=stop", "optim.divergence.entropy_share=0")
    with Trainer(config(*settings), tmp_path) as trainer, \
            pytest.raises(DivergenceError, match=r"at step 4: no action was valid and no reward was earned for 3 steps "
                                                 r"\(valid-action rate before: (0\.[5-9]\d|1\.00);"):  # step 1 live
        trainer.run()


def test_warn_mode_prints_one_line_and_trains_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Warn is the default."""
    with Trainer(config("optim.lr=1e30", "steps=5"), tmp_path) as trainer:
        records = trainer.run()
    assert len(records) == 5
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: training diverged")]
    # one line per kind: the entropy test at step 2, the collapse at step 4
    assert [line.split(":")[1].strip() for line in lines] == ["training diverged at step 2",
                                                               "training diverged at step 4"]


def test_the_cli_stops_a_diverged_run_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACERL_DEBUG", raising=False)
    settings = [*CHEAP, "optim.lr=1e30", "steps=4", "optim.divergence.mode=stop"]
    overrides = [arg for item in settings for arg in ("--set", item)]
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(tmp_path / "run"), *overrides])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train failed: training diverged at step 2"), result.stderr


def test_the_cli_stops_a_non_finite_run_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On main the NaN stop was a RuntimeError: a ~95-line traceback."""
    def nan_update(*args: object, **kwargs: object) -> dict[str, float]:
        nan = float("nan")
        return {"loss": nan, "grad_norm": nan, "kl": 0.0, "clip_fraction": 0.0, "trained_tokens": 0.0,
                "nonfinite_skipped": 1.0}

    monkeypatch.delenv("TRACERL_DEBUG", raising=False)
    monkeypatch.setattr(loop_module, "policy_update", nan_update)
    overrides = [arg for item in [*CHEAP, "steps=5", "optim.max_nonfinite_steps=2"] for arg in ("--set", item)]
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(tmp_path / "run"), *overrides])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "steps 1..2 had a non-finite loss or gradient norm" in lines[0], result.stderr
    assert "Traceback" not in result.output


def records(**series: list[float]) -> list[dict[str, Any]]:
    steps = len(next(iter(series.values())))
    return [{"step": i + 1, **{k: v[i] for k, v in series.items()}} for i in range(steps)]


def test_a_gradient_norm_jump_stops_naming_the_metric_and_the_ratio() -> None:
    monitor = DivergenceMonitor(DivergenceConfig(mode="stop"), vocab_size=400)
    for record in records(grad_norm=[1.0, 2.0, 1.5])[:3]:
        monitor.observe(record, lambda: "No checkpoint")
    with pytest.raises(DivergenceError, match=r"step 4: grad_norm = 1\.5e\+03 is 1e\+03x its running median over "
                                              r"the last 3 steps \(optim.divergence.jump_factor = 1000\)"):
        monitor.observe({"step": 4, "grad_norm": 1500.0}, lambda: "No checkpoint")


def test_no_jump_test_before_warmup_and_state_round_trips() -> None:
    monitor = DivergenceMonitor(DivergenceConfig(mode="stop", warmup=3), vocab_size=400)
    for record in records(loss=[0.1, 0.1, 1e6]):  # the third step has only 2 steps of history
        monitor.observe(record, lambda: "")
    resumed = DivergenceMonitor(DivergenceConfig(mode="stop", warmup=3), vocab_size=400)
    resumed.load_state_dict(monitor.state_dict())
    assert resumed.history == {"loss": [0.1, 0.1, 1e6]}
    with pytest.raises(DivergenceError, match="loss = 1e\\+09"):  # median 0.1: 1e10x
        resumed.observe({"step": 4, "loss": 1e9}, lambda: "")


def test_off_never_tests_and_bad_settings_name_the_field() -> None:
    monitor = DivergenceMonitor(DivergenceConfig(mode="off"), vocab_size=400)
    for record in records(grad_norm=[1.0, 1.0, 1.0, 1e9]):
        monitor.observe(record, lambda: "")
    with pytest.raises(ValueError, match="optim.divergence.mode = 'loud' is not valid; allowed values: stop, warn"):
        config("optim.divergence.mode=loud")
