"""The layout shows the architecture: imports run one way, and the planning wing needs only the core.

Rooms, lowest first: ``core`` (pure math and the protocol records); ``models`` and ``envs``
over it; ``agent`` (formats render environments' observations); ``testbed`` (the tiny model, its
data and pretraining); ``rollout`` (the execution wing: engine, local and Ray executors, their
workers, weight sync, evaluation); ``allocation`` (the planning wing: schemes, the session, the
TRACE planner, the predictor, on ``core`` only, so a distributed driver plans without loading
model code); ``config`` (the schema and its checks); ``runs`` (the run folder and what a run
writes); ``view`` (reading a run back); ``train`` (the loop, the update, run and resume, the
Python API); ``distributed`` (FSDP2 over the Trainer); ``cli``. ``integrations`` (tracerl inside
another framework: verl's rollout manager composes the session, the executor, the engine and the
run's config) sits at the top beside ``cli``. Inside a room, no two modules import each other.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOWER = {"core", "models", "envs", "agent", "testbed", "rollout", "allocation"}
BELOW = {
    "core": set(),
    "allocation": {"core"},
    "models": {"core"},
    "envs": {"core"},
    "agent": {"core", "envs"},
    "testbed": {"core", "models", "envs", "agent"},
    "rollout": {"core", "models", "envs", "agent", "testbed"},
    "config": LOWER,
    "runs": LOWER | {"config"},
    "view": LOWER | {"config", "runs"},
    "train": LOWER | {"config", "runs", "view"},
    "distributed": LOWER | {"config", "runs", "train"},
    "cli": LOWER | {"config", "runs", "view", "train", "distributed"},
    "integrations": LOWER | {"config", "runs", "train"},
}
"""What each room may import besides itself and the dependency-free bottom modules; lazy imports included."""
BOTTOM = {"__init__", "errors", "progress", "atomic", "busy_cores"}
"""Modules of the standard library alone, importable from anywhere: ``busy_cores`` must load before torch."""


def _room(path: Path) -> str:
    parts = path.relative_to(ROOT / "tracerl").with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))  # and each name, which may be a module of that package
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module != "tracerl"]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, name) for line, name in out if name.startswith("tracerl.")]


def test_no_import_runs_back_up() -> None:
    wrong = []
    for path in sorted((ROOT / "tracerl").rglob("*.py")):
        room = _room(path)
        if room in BOTTOM:
            continue
        assert room in BELOW, f"{path}: room {room!r} has no place in the layout (add it to BELOW)"
        for line, name in _imports(path):
            target = name.split(".")[1]
            if target not in BELOW[room] | {room} | BOTTOM:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {name}")
    assert wrong == []


def _loaded(*modules: str) -> list[str]:
    """The tracerl modules (and model libraries) a fresh interpreter holds after importing ``modules``."""
    code = (f"import sys\nfor m in {list(modules)!r}: __import__(m)\n"
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tracerl', 'transformers', 'vllm', 'ray'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_planning_wing_loads_only_the_core() -> None:
    loaded = _loaded("tracerl.allocation.schemes", "tracerl.allocation.session", "tracerl.allocation.trace_scheme",
                     "tracerl.allocation.predictor", "tracerl.core.protocol", "tracerl.core.seeds")
    outside = [m for m in loaded if m.split(".")[:2] not in (["tracerl"], ["tracerl", "core"], ["tracerl", "allocation"])]
    assert outside == []  # no model code, no environments, no transformers


def test_models_load_neither_environments_nor_agent_formats() -> None:
    modules = sorted(f"tracerl.models.{p.stem}" for p in (ROOT / "tracerl" / "models").glob("*.py")
                     if p.stem != "__init__")
    loaded = _loaded(*modules)
    assert "tracerl.models.backend" in loaded
    assert [m for m in loaded if m.split(".")[1:2] in (["envs"], ["agent"], ["testbed"], ["rollout"])] == []


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _reach(arrows: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in arrows.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_import_circles() -> None:
    """No module reaches itself through imports (two modules importing each other, or a longer
    ring). Lazy imports and ``import_module("tracerl...")`` by string count; a package's
    ``__init__`` importing its own modules does not (that is how a package re-exports)."""
    modules = {_module(p): p for p in (ROOT / "tracerl").rglob("*.py")}
    arrows: dict[str, set[str]] = {}
    for name, path in modules.items():
        text = path.read_text()
        targets = {t for _, t in _imports(path)} | set(re.findall(r"import_module\(\"(tracerl[\w.]*)\"", text))
        for target in targets:
            found = target if target in modules else target.rpartition(".")[0]
            if found in modules and found != name and not name.startswith(found + "."):
                arrows.setdefault(name, set()).add(found)
    reach = {name: _reach(arrows, name) for name in arrows}
    circles = {tuple(sorted(m for m in reach[name] if name in reach.get(m, set()))) for name in arrows if name in reach[name]}
    assert sorted(" -> ".join(c) for c in circles) == []


def test_the_execution_wing_reads_no_config_schema() -> None:
    """A Ray rollout worker and the spec it is built from load neither the config schema nor the
    trainer: the spec is plain data naming its builder by import path."""
    loaded = _loaded("tracerl.rollout.ray_worker", "tracerl.rollout.worker_spec", "tracerl.rollout.weight_sync",
                     "tracerl.rollout.executor", "tracerl.rollout.engine")
    assert [m for m in loaded if m.split(".")[1:2] in (["train"], ["config"], ["runs"], ["distributed"])] == []


def test_the_core_imports_only_torch_numpy_and_the_standard_library() -> None:
    allowed = {"torch", "numpy", "tracerl"} | set(sys.stdlib_module_names)
    wrong = []
    for path in sorted((ROOT / "tracerl" / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0] not in allowed]
    assert wrong == []


def test_train_is_a_room_not_a_grab_bag() -> None:
    assert len(list((ROOT / "tracerl" / "train").glob("*.py"))) <= 18


def test_the_documented_layout_names_every_room() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page[page.index("```\ntracerl/\n"):]
    block = block[: block.index("```", 4)]
    listed = {line.split()[0].rstrip("/") for line in block.splitlines()[2:] if line.startswith("  ") and line[2] != " "}
    rooms = {p.name for p in (ROOT / "tracerl").iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"cli.py"}
    assert listed == rooms
