"""``--smoke`` is the smoke-pretrained tiny model (tools, rewards, credit); ``--smoke-random`` the random one.

The refusals run before the model is loaded or a run folder exists; the 2-step run loads the smoke
model shipped in the package (nothing is pretrained).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, list(args))


def refusal(result) -> str:  # noqa: ANN001
    """The one stderr line of a refused command, without its ``train failed: `` prefix."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and " failed: " in lines[0], result.stderr
    return lines[0].split(" failed: ", 1)[1]


def city(name: str) -> str:
    """A tool the smoke-pretrained vocabulary has never seen."""
    return name


def test_smoke_modes_of_the_python_api() -> None:
    pretrained = resolve_config("grpo", smoke=True)
    assert (pretrained.model.name_or_path, pretrained.model.tiny_preset) == ("tiny", "smoke")
    assert pretrained.rollout.engine.temperature == 0.7 and pretrained.steps == 2
    assert resolve_config("grpo", smoke="pretrained") == pretrained
    random = resolve_config("grpo", smoke="random")
    assert random.model.name_or_path == "random-tiny" and random.rollout.engine.temperature == 1.0
    assert random.rollout.budget == pretrained.rollout.budget == 16  # one overlay, two models
    with pytest.raises(ConfigError, match="smoke must be True, False, 'pretrained' or 'random', got 'tiny'"):
        resolve_config("grpo", smoke="tiny")


@pytest.mark.parametrize(("sets", "named"), [
    ([f"data.tools=[{__name__}:city]"], "data.tools"),
    (["model.format=chat"], "model.format = 'chat'"),
])
def test_smoke_refuses_what_the_pretrained_vocabulary_cannot_encode(tmp_path: Path, sets: list[str],
                                                                     named: str) -> None:
    out = tmp_path / "run"
    args = [arg for item in sets for arg in ("--set", item)]
    line = refusal(invoke("train", "grpo", "--smoke", "--out", str(out), *args))
    assert line.startswith("--smoke runs the smoke-pretrained tiny model, which cannot serve " + named)
    assert line.endswith("use --smoke-random (a random tiny model whose vocabulary is built from the run's "
                         "format and tools)")
    assert not out.exists()
    assert refusal(invoke("config", "show", "grpo", "--smoke", *args)) == line  # the same checks


def test_smoke_refuses_data_it_cannot_encode_and_smoke_random_takes_it(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "question": f"Which river crosses Qwertz {i}?", "answers": ["Zyxvut"]}) + "\n"
        for i in range(4)))
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "d", "title": "Qwertz", "text": "Zyxvut flows."}) + "\n")
    sets = ["--set", f"data.tasks={tmp_path / 'tasks.jsonl'}", "--set", f"data.corpus={tmp_path / 'corpus.jsonl'}"]
    line = refusal(invoke("config", "show", "grpo", "--smoke", *sets))
    assert line.startswith("--smoke: the smoke-pretrained tiny model cannot read this data, use --smoke-random "
                           "(a random tiny model whose vocabulary is built from the run's format and tools): "
                           "the tokenizer cannot encode 4 of 4 sampled gold answers")
    shown = invoke("config", "show", "grpo", "--smoke-random", *sets)
    assert shown.exit_code == 0 and "name_or_path: random-tiny" in shown.stdout


def test_smoke_and_smoke_random_together_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("train", "grpo", "--smoke", "--smoke-random", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "give --smoke (the smoke-pretrained tiny model) or --smoke-random" in result.stderr
    assert not (tmp_path / "run").exists()


def test_smoke_trace_credit_calls_tools_rewards_episodes_and_scores_readiness(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = invoke("train", "trace_credit", "--smoke", "--out", str(out), "--set", "eval.size=2")
    assert result.exit_code == 0, (result.output, result.exception)
    said = [line for line in result.stderr.splitlines() if line.startswith("--smoke: pretraining")]
    assert said == []  # the package ships the smoke model: nothing is pretrained
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # the overlay's two steps
    assert all(r["tool_calls"] > 0 and r["readiness_gain_mean"] is not None for r in records)
    assert max(r["reward_mean"] for r in records) > 0
    config = (out / "config.yaml").read_text()
    assert "tiny_preset: smoke" in config and "estimator: trace_credit" in config


def test_trainer_smoke_true_is_the_cli_smoke_and_refuses_a_custom_tool_in_one_line(tmp_path: Path) -> None:
    from tracerl.errors import UserError
    from tracerl.train import trainer

    with pytest.raises(UserError, match=r"^--smoke runs the smoke-pretrained tiny model, which cannot serve "
                                        r"data.tools = \['test_smoke:city'\].*; use --smoke-random"):
        trainer("grpo", tmp_path / "run", smoke=True, tools=[city])
    assert not (tmp_path / "run").exists()
