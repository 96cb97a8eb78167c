"""``tracerl eval``: --run (the latest checkpoint with the run's config), --model tiny, greedy by
default, progress lines when stderr is not a terminal, one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.envs.synthwiki import build_world, write_world
from tracerl.testbed.tiny_config import SMOKE_WORLD
from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer

from helpers_cli import smoke_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-step smoke run (random-tiny) with a checkpoint."""
    return smoke_run(tmp_path_factory.mktemp("eval") / "run")


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, list(args))


def test_eval_run_uses_the_latest_checkpoint_and_is_greedy_by_default(run_dir: Path, tmp_path: Path) -> None:
    first = invoke("eval", "--run", str(run_dir), "--limit", "3", "--out", str(tmp_path / "a.jsonl"))
    assert first.exit_code == 0, first.output
    metrics = json.loads(first.stdout)
    assert metrics["checkpoint"].endswith("ckpt-000001") and metrics["trajectories"] == 3
    assert metrics["mean_turns"] <= 2  # the run's limits (rollout.engine.max_turns=2), not the CLI's 8
    assert "eval: 3/3 tasks" in first.stderr  # not a terminal: plain progress lines
    other_seed = invoke("eval", "--run", str(run_dir), "--limit", "3", "--seed", "5", "--out", str(tmp_path / "b.jsonl"))
    assert other_seed.exit_code == 0
    texts = [[t["text"] for t in json.loads(line)["turns"]] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    again = [[t["text"] for t in json.loads(line)["turns"]] for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert texts == again  # greedy: the seed changes nothing


def test_eval_run_samples_with_a_temperature(run_dir: Path) -> None:
    result = invoke("eval", "--run", str(run_dir), "--limit", "2", "--samples", "2", "--temperature", "1",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["trajectories"] == 4 and "pass@2" in metrics
    assert result.stderr == ""


def test_eval_model_tiny_uses_the_embedded_model(tmp_path: Path) -> None:
    paths = write_world(build_world(SMOKE_WORLD), tmp_path / "world")
    result = invoke("eval", "--model", "tiny", "--tiny-preset", "smoke", "--tasks", str(paths["test"]),
                    "--corpus", str(paths["corpus"]), "--limit", "2", "--max-turns", "2", "--no-progress")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tasks"] == 2


@pytest.mark.parametrize(("args", "needle"), [
    ([], "--model MODEL"),
    (["--model", "tiny", "--run", "x"], "--model MODEL"),
    (["--model", "tiny"], "--tasks and --corpus"),
    (["--run", "x", "--temperature", "-1"], "--temperature"),
])
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    result = invoke("eval", *args)
    assert result.exit_code == 2 and needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_run_without_checkpoint_is_named(tmp_path: Path) -> None:
    result = invoke("eval", "--run", str(tmp_path))
    assert result.exit_code == 1 and "no checkpoint yet" in result.stderr


@pytest.mark.extras
def test_eval_run_of_a_lora_run_loads_the_adapter_on_the_initial_base(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from tracerl.train.evaluation import eval_run

    config = resolve_config("grpo", smoke="random", overrides=["steps=1", "eval.size=2", "rollout.engine.max_turns=2",
                                                            "model.lora.r=4", "optim.lr=1e-2"])
    with Trainer(config, tmp_path / "run") as trainer:
        trainer.run()
    assert (tmp_path / "run" / "ckpt-000001" / "policy" / "adapter_config.json").is_file()
    metrics = eval_run(tmp_path / "run", limit=2)
    assert metrics["trajectories"] == 2 and metrics["checkpoint"].endswith("ckpt-000001")
