"""The layout shows the architecture: imports run one way, and the planning wing needs only the core.

Rooms, lowest first: ``core`` (pure math and the protocol records); ``models`` and ``envs``
over it; ``agent`` (formats render environments' observations); ``testbed`` (the tiny model, its
data and pretraining); ``rollout`` (execution: engine, executors, evaluation); ``train``; ``cli``.
``allocation`` is the planning wing: schemes, the session, the TRACE planner, the predictor, on
``core`` only, so a distributed driver plans without loading model code. ``integrations`` (tracerl
inside another framework: verl's rollout manager composes the session, the executor, the engine and
the run's config) sits at the top beside ``cli``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BELOW = {
    "core": set(),
    "allocation": {"core"},
    "models": {"core"},
    "envs": {"core"},
    "agent": {"core", "envs"},
    "testbed": {"core", "models", "envs", "agent"},
    "rollout": {"core", "models", "envs", "agent", "testbed"},
    "train": {"core", "models", "envs", "agent", "testbed", "rollout", "allocation"},
    "cli": {"core", "models", "envs", "agent", "testbed", "rollout", "allocation", "train"},
    "integrations": {"core", "models", "envs", "agent", "testbed", "rollout", "allocation", "train"},
}
"""What each room may import besides itself, ``tracerl.errors`` and ``tracerl.progress`` (dependency-free
bottom modules); lazy imports included."""


def _room(path: Path) -> str:
    parts = path.relative_to(ROOT / "tracerl").with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, name) for line, name in out if name.startswith("tracerl.")]


def test_no_import_runs_back_up() -> None:
    wrong = []
    for path in sorted((ROOT / "tracerl").rglob("*.py")):
        room = _room(path)
        if room in ("__init__", "errors", "progress"):
            continue
        assert room in BELOW, f"{path}: room {room!r} has no place in the layout (add it to BELOW)"
        for line, name in _imports(path):
            target = name.split(".")[1]
            if target not in BELOW[room] | {room, "errors", "progress"}:
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
