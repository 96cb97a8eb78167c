"""What a resume may change (issue 51, item 1): steps, evaluation, logging, checkpoint cadence and the
machine are applied; any other ``--set``, ``--config`` key or a different preset is refused in one
line naming each key with the run's value and the given one, by ``tracerl train --resume`` and by
``trainer(..., resume=True)`` alike (one rule: tracerl/config/resume_rule.py)."""

from __future__ import annotations

import dataclasses
import shutil
import typing
from pathlib import Path

import pytest

from helpers_cli import invoke, one_line
from tracerl.config.loading import parse_yaml
from tracerl.config.resume_rule import RESUME_MUTABLE, check_resume_changes, differences, mutable_summary
from tracerl.config.schema import TrainConfig
from tracerl.errors import UserError
from tracerl.runs.metrics import read_metrics

FAST = ["eval.size=2", "rollout.budget=16"]
"""The started run's own settings (--smoke-random makes it seconds)."""


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step ``trace`` run (checkpoint at step 1), started through the CLI."""
    out = tmp_path_factory.mktemp("started") / "run"
    sets = [arg for item in FAST for arg in ("--set", item)]
    result = invoke("train", "trace", "--smoke-random", "--out", str(out), "--steps", "1", *sets)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture()
def run(trace_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trace_run, copy)
    return copy


def saved_config(run_dir: Path, step: int) -> dict[str, typing.Any]:
    path = run_dir / f"ckpt-{step:06d}" / "config.yaml"
    return parse_yaml(path.read_text(), path)


def test_a_learning_rate_change_is_refused_naming_both_values(run: Path) -> None:
    before = (run / "metrics.jsonl").read_bytes()
    line = one_line(invoke("train", "--resume", str(run), "--steps", "17", "--set", "optim.lr=1e-3"),
                    "train failed:", "optim.lr (run: 0.0003, given: 0.001)", "--out NEW_RUN_DIR")
    assert "eval.*, log.*" in line  # the rule names what may change
    assert (run / "metrics.jsonl").read_bytes() == before and not (run / "ckpt-000017").exists()


def test_every_refused_key_is_named_in_the_one_line(run: Path) -> None:
    one_line(invoke("train", "--resume", str(run), "--steps", "3", "--set", "optim.lr=1e-3",
                    "--set", "rollout.budget=32", "--set", "eval.size=3"),
             "rollout.budget (run: 16, given: 32), optim.lr (run: 0.0003, given: 0.001)")


def test_another_preset_is_refused(run: Path) -> None:
    one_line(invoke("train", "grpo", "--resume", str(run), "--steps", "3"),
             "preset (run: 'trace', given: 'grpo')")
    one_line(invoke("train", "tarce", "--resume", str(run), "--steps", "3"), "unknown preset 'tarce'",
             "did you mean 'trace'?")


def test_a_config_file_is_held_to_the_same_rule(run: Path, tmp_path: Path) -> None:
    (tmp_path / "more.yaml").write_text("optim:\n  grad_clip: 0.5\n")
    one_line(invoke("train", "--resume", str(run), "--steps", "3", "--config", str(tmp_path / "more.yaml")),
             "optim.grad_clip (run: 1.0, given: 0.5)")


def test_the_same_preset_and_mutable_keys_are_applied(run: Path) -> None:
    result = invoke("train", "trace", "--resume", str(run), "--steps", "2", "--set", "eval.size=3",
                    "--set", "log.checkpoint_every=1", "--set", "optim.lr=0.0003")  # lr as started: no change
    assert result.exit_code == 0, result.output
    assert "to step 2, with eval.size, log.checkpoint_every changed" in result.stderr
    config = saved_config(run, 2)
    assert (config["eval"]["size"], config["log"]["checkpoint_every"], config["steps"]) == (3, 1, 2)
    assert config["optim"]["lr"] == 0.0003 and config["preset"] == "trace"
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_flags_of_a_fresh_start_do_not_go_with_resume(run: Path, tmp_path: Path) -> None:
    for flags, needle in ((["--overwrite"], "not both"), (["--smoke-random"], "keeps its own"),
                          (["--out", str(tmp_path / "elsewhere")], "in place")):
        result = invoke("train", "--resume", str(run), "--steps", "3", *flags)
        assert result.exit_code == 2 and needle in result.stderr, result.output


def test_the_python_api_applies_the_same_rule(run: Path) -> None:
    from tracerl.train import trainer

    with pytest.raises(UserError, match=r"cannot change optim.lr \(run: 0.0003, given: 0.001\).*"
                                        r"start a new run with overwrite=True or another out"):
        trainer("trace", run, smoke="random", steps=2, overrides=[*FAST, "optim.lr=1e-3"], resume=True)
    with pytest.raises(UserError, match=r"cannot change preset \(run: 'trace', given: 'grpo'\)"):
        trainer("grpo", run, smoke="random", steps=2, overrides=FAST, resume=True)
    with trainer("trace", run, smoke="random", steps=2, overrides=[*FAST, "eval.size=3"], resume=True,
                 quiet=True) as resumed:
        resumed.run()
    assert saved_config(run, 2)["eval"]["size"] == 3


# --- the rule itself ---------------------------------------------------------------------------


def test_differences_name_dotted_leaves_and_ignore_keys_one_side_lacks() -> None:
    saved = {"steps": 5, "optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "old": 1}
    given = {"steps": 7, "optim": {"lr": 0.1, "betas": (0.9, 0.9)}, "new": 2}
    assert differences(saved, given) == [("steps", 5, 7), ("optim.betas", [0.9, 0.99], [0.9, 0.9])]


def test_check_returns_the_mutable_changes_and_refuses_the_rest() -> None:
    saved = {"steps": 5, "eval": {"size": 2}, "optim": {"lr": 0.1}}
    assert check_resume_changes(saved, {"steps": 9, "eval": {"size": 4}, "optim": {"lr": 0.1}}, "r", "x") == \
        ["steps", "eval.size"]
    with pytest.raises(UserError, match=r"^resuming r cannot change optim.lr \(run: 0.1, given: 0.2\): a resume"):
        check_resume_changes(saved, {"steps": 9, "eval": {"size": 4}, "optim": {"lr": 0.2}}, "r", "x")


def test_every_mutable_key_is_a_config_field() -> None:
    for key in RESUME_MUTABLE:
        cls: typing.Any = TrainConfig
        for part in key.split("."):
            hints = typing.get_type_hints(cls)
            assert part in hints, key
            cls = hints[part]
        assert not dataclasses.is_dataclass(cls), f"{key} is a whole section; list its fields"
    summary = mutable_summary()
    assert summary.startswith("steps, eval.*, log.*, dist.*, model.device, model.threads"), summary
