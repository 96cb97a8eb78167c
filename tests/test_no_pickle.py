"""No pickle from a file anywhere in the package: every ``torch.load`` says ``weights_only=True``,
nothing calls ``pickle.load``/``loads`` (or a look-alike), and the one restricted unpickler is on an
allow-list with its reason. Read from the code's syntax tree, so a docstring that names the
unsafe call (safe_dcp.py explains what it replaces) is not a finding."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch

from tracerl.errors import UserError
from tracerl.integrations.verl.predictor_io import PREDICTOR_FILE, load_predictor_state, save_predictor_state

PACKAGE = Path(__file__).resolve().parents[1] / "tracerl"
UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}
UNSAFE_NAMES = {"load", "loads", "Unpickler", "open"}
SAFE_KEYWORDS = {"weights_only": True, "allow_pickle": False}
"""A keyword of a loader and the only value that keeps pickles out."""
ALLOWED = {
    ("runs/safe_dcp.py", "pickle.Unpickler"):
        "a restricted Unpickler whose find_class builds only torch.distributed.checkpoint's metadata "
        "classes by name and refuses everything else: DCP stores its .metadata as a pickle",
}
"""(file under tracerl/, finding) -> why it is safe."""


def findings(source: str) -> list[str]:
    """The unsafe loads in ``source``, sorted: ``LINE: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in UNPICKLERS \
                and node.attr in UNSAFE_NAMES:
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module in UNPICKLERS:
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names if a.name in UNSAFE_NAMES]
        elif isinstance(node, ast.keyword) and node.arg in SAFE_KEYWORDS:
            if not (isinstance(node.value, ast.Constant) and node.value.value is SAFE_KEYWORDS[node.arg]):
                found.append((node.value.lineno, f"{node.arg}={ast.unparse(node.value)}"))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load" and not any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords):
            found.append((node.lineno, "torch.load without weights_only=True"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_scanner_finds_each_unsafe_load() -> None:
    bad = ("import pickle, torch, numpy as np\nfrom dill import loads\n"
           "a = pickle.load(f)\nb = torch.load(p)\nc = torch.load(p, weights_only=False)\n"
           "d = np.load(p, allow_pickle=True)\ne = pickle.Unpickler(f)\nf = marshal.loads(b)\n")
    assert findings(bad) == ["2: from dill import loads", "3: pickle.load", "4: torch.load without weights_only=True",
                             "5: torch.load without weights_only=True", "5: weights_only=False",
                             "6: allow_pickle=True", "7: pickle.Unpickler", "8: marshal.loads"]
    good = ('"""torch.load(p, weights_only=False) in a docstring"""\nimport torch, pickle\n'
            "x = torch.load(p, weights_only=True, map_location='cpu')\ny = pickle.dumps(x)\n"
            "z = np.load(p, allow_pickle=False)\n")
    assert findings(good) == []


def test_no_pickle_from_a_file_in_the_package() -> None:
    unexpected, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for finding in findings(path.read_text(encoding="utf-8")):
            key = (rel, finding.split(": ", 1)[1])
            if key in ALLOWED:
                used.add(key)
            else:
                unexpected.append(f"tracerl/{rel}:{finding}")
    assert unexpected == []
    assert used == set(ALLOWED)  # an allow-list entry nothing needs any more must go


class _RunsCode:
    """What a crafted checkpoint would hold: unpickling it calls ``os.system``."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.sentinel}",))


def test_a_crafted_verl_predictor_state_is_refused_in_one_line(tmp_path: Path) -> None:
    sentinel = tmp_path / "ran"
    torch.save({"weight": torch.ones(2), "payload": _RunsCode(sentinel)}, tmp_path / PREDICTOR_FILE)
    with pytest.raises(UserError) as refused:
        load_predictor_state(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / PREDICTOR_FILE} holds objects other than tensors and plain data")
    assert "\n" not in message and not sentinel.exists()


def test_a_verl_predictor_state_round_trips_and_a_missing_one_is_named(tmp_path: Path) -> None:
    state = {"linear.weight": torch.arange(6.0).reshape(2, 3), "linear.bias": torch.tensor([0.5, -0.5])}
    path = save_predictor_state(state, tmp_path / "global_step_3")
    assert path == tmp_path / "global_step_3" / PREDICTOR_FILE and sorted(p.name for p in path.parent.iterdir()) == [
        PREDICTOR_FILE]
    loaded = load_predictor_state(path.parent)
    assert sorted(loaded) == sorted(state) and all(torch.equal(loaded[k], state[k]) for k in state)
    with pytest.raises(UserError, match=f"^{tmp_path / 'nowhere' / PREDICTOR_FILE}: no tracerl predictor state"):
        load_predictor_state(tmp_path / "nowhere")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / PREDICTOR_FILE).write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="is corrupted or truncated"):
        load_predictor_state(tmp_path / "torn")
