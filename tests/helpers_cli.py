"""Running the CLI in-process and reading a refusal: exit 1, one line on stderr, no traceback; and
the finished one-step smoke run the run-folder tests start from."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tracerl.cli import app


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, list(args))


def one_line(result, *needles: str) -> str:  # noqa: ANN001
    """The single stderr line of a failed command, holding every ``needle``."""
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


SMOKE_RUN = ["steps=1", "eval.size=2", "rollout.engine.max_turns=2"]
"""A one-step ``grpo`` run on the random tiny model: a checkpoint in seconds."""


def smoke_run(out: Path, *overrides: str) -> Path:
    """Train :data:`SMOKE_RUN` (plus ``overrides``) into ``out`` and return it."""
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer

    with Trainer(resolve_config("grpo", smoke="random", overrides=[*SMOKE_RUN, *overrides]), out) as trainer:
        trainer.run()
    return out
