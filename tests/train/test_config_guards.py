"""Numbers in a config: booleans are not numbers, and every number lies in a range the code can
compute with; each refusal is one line naming the field (through the CLI too)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError


@pytest.mark.parametrize(("override", "message"), [
    ("steps=true", "steps = True: expected an integer, not a boolean"),  # on main: trained 1 step
    ("optim.lr=true", "optim.lr = True: expected a number, not a boolean"),  # on main: lr 1.0
    ("optim.lr=3e38", "optim.lr = 3e+38 is out of range: it must lie in [0, 1e+30]"),  # on main: AdamW crashed
    ("eval.temperature=1e31", "eval.temperature = 1e+31 is out of range"),
    ("data.tool_timeout_s=1e30", "data.tool_timeout_s = 1e+30 is out of range: it must lie in [0, 1e+06]"),
    ("seed=" + "9" * 40, "seed = an integer of 40 digits is out of range: it must lie in [-(2**63-1), 2**63-1]"),
    ("seed=" + "9" * 5000, "override seed: the value (5000 characters) cannot be read as a number"),
    ("rollout.engine.max_turns=" + "7" * 30, "rollout.engine.max_turns = an integer of 30 digits is out of range"),
])
def test_a_bad_number_names_its_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config("grpo", smoke="random", overrides=[override])
    assert message in str(info.value)
    assert len(str(info.value)) < 400  # the 5000 digits are not echoed


def test_a_number_too_long_to_read_in_a_config_file_names_its_field(tmp_path: Path) -> None:
    """A 5,000-digit integer in a --config file stopped Python's int() with a line naming no field."""
    path = tmp_path / "big.yaml"
    path.write_text("optim:\n  lr: 0.001\nrollout:\n  engine:\n    max_turns: " + "7" * 5000 + "\n")
    with pytest.raises(ConfigError) as info:
        resolve_config("grpo", smoke="random", config_file=str(path))
    assert "field 'rollout.engine.max_turns' (line 5, 5000 characters) cannot be read" in str(info.value)
    assert len(str(info.value)) < 400


def test_numbers_at_the_edges_of_the_ranges_are_accepted() -> None:
    edges = ["optim.lr=1e30", f"seed={2**63 - 1}", "data.tool_timeout_s=1e6"]
    config = resolve_config("grpo", smoke="random", overrides=edges)
    assert (config.optim.lr, config.seed, config.data.tool_timeout_s) == (1e30, 2**63 - 1, 1e6)


@pytest.mark.parametrize("override", ["optim.lr=3e38", "steps=true", "seed=" + "9" * 5000])
def test_the_cli_prints_one_line_and_creates_no_folder(tmp_path: Path, override: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACERL_DEBUG", raising=False)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(out), "--set", override])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train failed: ") and override.split("=")[0] in lines[0]
    assert not out.exists()
