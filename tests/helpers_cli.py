"""Running the CLI in-process and reading a refusal: exit 1, one line on stderr, no traceback."""

from __future__ import annotations

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
