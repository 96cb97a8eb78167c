"""A fast subset of benchmarks/reliability/hostile_inputs.py in the default suite: real ``tracerl`` processes on
hostile inputs end in one line, touch nothing outside their folder, and stay under the memory bound."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "reliability"))
import hostile_inputs as probe  # noqa: E402

FAST = ["lock_link_fresh", "metrics_dangling_link", "yaml_bomb_config", "deep_json_env_check", "torn_tasks"]
"""Cases that need no trained run folder (each is one CLI process, ~10 s of imports)."""


def test_the_fast_cases_end_in_one_line_inside_their_folder(tmp_path: Path) -> None:
    results = probe.probe(FAST, tmp_path, timeout=120, memory_mib=1536)
    failed = [f"{r['case']}: {r['problems']} ({r['line']})" for r in results if not r["ok"]]
    assert not failed, failed
    assert [r["case"] for r in results] == FAST
    assert all(r["peak_rss_mib"] is not None and r["stderr_lines"] == 1 for r in results)


def test_the_probe_detects_a_write_outside_and_an_echo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge itself can fail: a 'command' that writes beside the sentinel and echoes it is caught."""

    def leaky(work: Path, run: Path) -> list[str]:
        (work / "leak.py").write_text(
            "import sys, pathlib\n"
            f"pathlib.Path({str(tmp_path / 'leaky' / 'outside' / 'new.txt')!r}).write_text('x')\n"
            f"sys.stderr.write({probe.SECRET.strip()!r} + '\\n')\nsys.exit(1)\n")
        return []

    monkeypatch.setattr(probe, "_WRAPPER", "import runpy; runpy.run_path('leak.py')")
    result = probe.run_case(probe.Case("leaky", "test", leaky, needs_run=False), tmp_path, None, 60, 1536)
    assert not result["ok"]
    assert "something outside the folder changed" in result["problems"]
    assert "the sentinel's content was echoed" in result["problems"]
