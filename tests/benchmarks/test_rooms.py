"""benchmarks/ is four rooms by purpose (issue 51): every script sits in one room and its room's
README names it, only the shared modules stay at the top, each script finds the modules it
imports when run as ``python benchmarks/ROOM/SCRIPT.py``, and every script path the docs, the
README, the Makefile, the tests and the code cite exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
ROOMS = ("science", "systems", "gpu", "reliability")
SHARED = {"common", "protocol", "stats", "tables", "shards"}
INSERT = re.compile(r'^sys\.path\.insert\(\d+, str\(Path\(__file__\)\.resolve\(\)\.parents\[1\](?: / "(\w+)")?\)\)', re.M)


def _scripts(room: str) -> list[Path]:
    return sorted((BENCH / room).glob("*.py"))


def _where() -> dict[str, str]:
    """Each benchmark module's folder: a room's name, or "" for the top (the shared modules)."""
    where = {p.stem: "" for p in BENCH.glob("*.py")}
    for room in ROOMS:
        where |= {p.stem: room for p in _scripts(room)}
    return where


def _imported(path: Path) -> set[str]:
    """The top-level names a file imports, lazy imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
    return names


def test_only_the_shared_modules_stay_at_the_top_and_each_room_readme_names_its_scripts() -> None:
    assert {p.stem for p in BENCH.glob("*.py")} == SHARED
    for room in ROOMS:
        readme = (BENCH / room / "README.md").read_text(encoding="utf-8")
        unnamed = [p.name for p in _scripts(room) if f"`{p.name}`" not in readme]
        assert _scripts(room) and unnamed == [], room
        assert f"({room}/README.md)" in (BENCH / "README.md").read_text(encoding="utf-8")


def test_each_script_puts_the_folders_of_what_it_imports_on_sys_path_itself() -> None:
    """Run as a script, only the script's own folder heads sys.path: a shared module or another
    room's script must be added by the script's own ``sys.path.insert`` lines."""
    where, missing = _where(), []
    for room in ROOMS:
        for script in _scripts(room):
            added = {room} | {m or "" for m in INSERT.findall(script.read_text(encoding="utf-8"))}
            needed = {(name, where[name]) for name in _imported(script) if name in where}
            missing += [f"{room}/{script.name} imports {name} ({folder or 'top'})" for name, folder in needed
                        if folder not in added]
    assert missing == []


def test_a_script_that_imports_across_rooms_runs_from_another_folder(tmp_path: Path) -> None:
    """systems/step_overhead.py imports the shared common.py and science/sample_efficiency.py."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(BENCH / "systems" / "step_overhead.py"), "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout


def test_every_cited_benchmark_script_exists() -> None:
    cited = re.compile(r"(?<![\w/])benchmarks/[a-z0-9_/]+\.py\b")  # ROOM/SCRIPT.py is a placeholder
    files = [ROOT / "README.md", ROOT / "Makefile", *BENCH.glob("**/README.md"), *(ROOT / "docs").glob("**/*.md"),
             *(ROOT / "tracerl").glob("**/*.py"), *(ROOT / "tests").glob("**/*.py"), *(ROOT / "examples").glob("**/*.md"),
             *BENCH.glob("**/*.py")]
    absent = {f"{f.relative_to(ROOT)}: {m}" for f in files for m in cited.findall(f.read_text(encoding="utf-8"))
              if not (ROOT / m).exists()}
    assert absent == set()
