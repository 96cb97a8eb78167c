"""The documentation's code runs as written: the "As a library" block of docs/library.md prints what its
comments say, and the "Train from Python" example of docs/getting-started.md trains."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "docs" / "library.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def library_block() -> str:
    """The first ```python block after the "## As a library" heading."""
    text = LIBRARY.read_text(encoding="utf-8")
    section = text.split("\n## As a library\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match is not None, "no python block under '## As a library'"
    return match.group(1)


def expected_lines(code: str) -> list[str]:
    """The comment after each ``print(...)`` (or on the line below it when the line has none)."""
    lines = code.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comment = line.split("  # ", 1)[1] if "  # " in line else lines[i + 1].removeprefix("# ")
        out.append(comment.strip())
    return out


def test_library_snippet_runs_and_prints_its_comments() -> None:
    code = library_block()
    namespace: dict[str, object] = {"__name__": "readme_snippet"}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, str(LIBRARY), "exec"), namespace)  # noqa: S102 - the docs are ours
    printed = stdout.getvalue().splitlines()
    assert printed == expected_lines(code) and len(printed) == 5
    # The property the prose states: zero on prompt and observation tokens, +-1 on the answer.
    for adv, traj in zip(namespace["advantages"], namespace["batch"].trajectories, strict=True):  # type: ignore[attr-defined]
        forced = [not s for s in traj.sampled]
        assert adv[forced].abs().sum() == 0 and abs(abs(float(adv[-1])) - 1.0) < 1e-6


def python_training_block() -> str:
    """The ```python block under "## Train from Python"."""
    section = GETTING_STARTED.read_text(encoding="utf-8").split("\n## Train from Python\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match is not None, "no python block under '## Train from Python'"
    return match.group(1)


def test_python_training_example_runs_as_written(tmp_path: Path) -> None:
    """The getting-started page's ten-line trainer: a preset, overrides, a reward and a tool as plain functions,
    ``run()``, and the metrics read back; run as a script (its functions are ``__main__:...``)."""
    import json
    import os
    import subprocess
    import sys

    code = python_training_block()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 0.0 <= float(done.stdout.strip().splitlines()[-1]) <= 1.0  # the last record's eval_accuracy
    run = tmp_path / "runs" / "python"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and (run / "ckpt-000003").is_dir()
    config = (run / "config.yaml").read_text()
    assert "verifier: __main__:reward" in config and "- __main__:population" in config


def test_trainer_refuses_a_lambda_in_one_line(tmp_path: Path) -> None:
    import pytest

    from tracerl.errors import UserError
    from tracerl.train import trainer

    with pytest.raises(UserError, match=r"reward .* must be a function defined at module level"):
        trainer("grpo", tmp_path / "run", smoke="random", reward=lambda answer, task: 1.0)
    assert not (tmp_path / "run").exists()
