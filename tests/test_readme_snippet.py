"""The README's "As a library" block runs as written, and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def library_block() -> str:
    """The first ```python block after the "## As a library" heading."""
    text = README.read_text(encoding="utf-8")
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
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README is ours
    printed = stdout.getvalue().splitlines()
    assert printed == expected_lines(code) and len(printed) == 5
    # The property the prose states: zero on prompt and observation tokens, +-1 on the answer.
    for adv, traj in zip(namespace["advantages"], namespace["batch"].trajectories):  # type: ignore[attr-defined]
        forced = [not s for s in traj.sampled]
        assert adv[forced].abs().sum() == 0 and abs(abs(float(adv[-1])) - 1.0) < 1e-6
