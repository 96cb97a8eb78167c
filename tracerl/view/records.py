"""Typed, validated rollout records for ``tracerl view``: the pages render from these, never from raw JSON.

A run folder may come from someone else, so every record read back is checked field by field
before any of it reaches HTML: integers are integers (not strings, floats or booleans), numbers
are finite numbers or null, texts are strings, node ids are unique and every parent, path entry
and leaf names a node of the tree. A record that fails ends in one line naming ``file:line`` and
the field (``nodes[3].visits``), so a crafted record can neither inject markup through a field the
page prints unquoted nor end in a traceback.

Structural keys are required (tree: ``task_id``, ``nodes``, ``trajectories``; node: ``id``,
``parent``, ``action``, ``is_leaf``; trajectory: ``leaf``, ``node_path``); the others show a dash
when absent, since records written by older versions lack some of them (``prompt``, ``values``,
``credit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracerl.runs.rollout_log import RolloutRecordError, record_lines

Num = float | None


@dataclass(frozen=True)
class NodeView:
    """One tree node as recorded (runs/rollout_log.py ``node_record``)."""

    id: int
    parent: int | None
    action: str
    is_leaf: bool
    depth: int = 0
    text: str = ""
    assistant_tokens: int = 0
    observation: str = ""
    observation_tokens: int = 0
    reward: Num = None
    visits: int = 0
    value_target: Num = None
    readiness: Num = None
    predictor: Num = None


@dataclass(frozen=True)
class TrajectoryView:
    """One leaf's trajectory: ``readiness`` ``[T+1]``, ``values`` ``[T+1]``, ``credit`` ``[T]``,
    ``turn_advantage`` one per turn (``len(node_path) - 1`` turns)."""

    leaf: int
    node_path: tuple[int, ...]
    reward: Num = None
    infra_failed: bool = False
    answer: str | None = None
    readiness: tuple[Num, ...] | None = None
    turn_advantage: tuple[Num, ...] | None = None
    outcome_advantage: Num = None
    values: tuple[Num, ...] | None = None
    credit: tuple[Num, ...] | None = None


@dataclass(frozen=True)
class CreditOptionsView:
    """The ``algo.advantage`` options ``V_k`` and ``c_k`` were computed with."""

    value: str
    eps: float
    horizon: int
    gamma: float
    terminal_scale: float
    w_out: float
    w_turn: float


@dataclass(frozen=True)
class TreeView:
    """One rollout tree of a step."""

    task_id: str
    nodes: tuple[NodeView, ...]
    trajectories: tuple[TrajectoryView, ...]
    tree_id: str = ""
    question: str = ""
    answers: tuple[str, ...] = ()
    prompt: str = ""
    credit_options: CreditOptionsView | None = None


class _Bad(Exception):
    """A field failed its check: ``where`` names it inside the record."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(where, f"expected an integer, got {_kind(value)}")
    return value


def _opt_int(value: Any, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(where, f"expected a string, got {_kind(value)}")
    try:  # JSON's "\\ud800" decodes to a lone surrogate: no character, and the page's UTF-8 write fails on it
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _Bad(where, f"holds a lone surrogate (U+{ord(value[err.start]):04X} at character {err.start}), "
                          "not text") from None
    return value


def _opt_str(value: Any, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(where, f"expected true or false, got {_kind(value)}")
    return value


def _num(value: Any, where: str) -> Num:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(where, f"expected a finite number or null, got {_kind(value)}")
    return float(value)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Bad(where, f"expected a list, got {_kind(value)}")
    return value


def _each(check: Callable[[Any, str], Any]) -> Callable[[Any, str], tuple[Any, ...]]:
    return lambda value, where: tuple(check(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))


def _opt_each(check: Callable[[Any, str], Any]) -> Callable[[Any, str], tuple[Any, ...] | None]:
    return lambda value, where: None if value is None else _each(check)(value, where)


_REQUIRED = object()
Schema = dict[str, tuple[Callable[[Any, str], Any], Any]]


def _fields(obj: Any, schema: Schema, where: str) -> dict[str, Any]:
    """Check ``obj`` (a JSON object) against ``schema`` (key -> (check, default)); unknown keys are
    ignored (newer records may hold more), a missing required key is an error naming it."""
    if not isinstance(obj, dict):
        raise _Bad(where or "record", f"expected a JSON object, got {_kind(obj)}")
    out = {}
    for key, (check, default) in schema.items():
        name = f"{where}.{key}" if where else key
        if key not in obj:
            if default is _REQUIRED:
                raise _Bad(where or "record", f"lacks the key {key!r}")
            continue
        out[key] = check(obj[key], name)
    return out


NODE: Schema = {
    "id": (_int, _REQUIRED), "parent": (_opt_int, _REQUIRED), "action": (_str, _REQUIRED),
    "is_leaf": (_bool, _REQUIRED), "depth": (_int, 0), "text": (_str, ""), "assistant_tokens": (_int, 0),
    "observation": (_str, ""), "observation_tokens": (_int, 0), "reward": (_num, None),
    "visits": (_int, 0), "value_target": (_num, None), "readiness": (_num, None), "predictor": (_num, None),
}
TRAJECTORY: Schema = {
    "leaf": (_int, _REQUIRED), "node_path": (_each(_int), _REQUIRED), "reward": (_num, None),
    "infra_failed": (_bool, False), "answer": (_opt_str, None), "readiness": (_opt_each(_num), None),
    "turn_advantage": (_opt_each(_num), None), "outcome_advantage": (_num, None),
    "values": (_opt_each(_num), None), "credit": (_opt_each(_num), None),
}
CREDIT_OPTIONS: Schema = {
    "value": (_str, _REQUIRED), "eps": (_num, _REQUIRED), "horizon": (_int, _REQUIRED),
    "gamma": (_num, _REQUIRED), "terminal_scale": (_num, _REQUIRED), "w_out": (_num, _REQUIRED),
    "w_turn": (_num, _REQUIRED),
}


def _credit_options(value: Any, where: str) -> CreditOptionsView | None:
    return None if value is None else CreditOptionsView(**_fields(value, CREDIT_OPTIONS, where))


def _nodes(value: Any, where: str) -> tuple[NodeView, ...]:
    return tuple(NodeView(**_fields(n, NODE, f"{where}[{i}]")) for i, n in enumerate(_list(value, where)))


def _trajectories(value: Any, where: str) -> tuple[TrajectoryView, ...]:
    return tuple(TrajectoryView(**_fields(t, TRAJECTORY, f"{where}[{i}]"))
                 for i, t in enumerate(_list(value, where)))


TREE: Schema = {
    "task_id": (_str, _REQUIRED), "nodes": (_nodes, _REQUIRED), "trajectories": (_trajectories, _REQUIRED),
    "tree_id": (_str, ""), "question": (_str, ""), "answers": (_each(_str), ()), "prompt": (_str, ""),
    "credit_options": (_credit_options, None),
}


def _check_links(tree: TreeView) -> None:
    """Unique node ids; every parent, path entry and leaf names a node of this tree."""
    ids: set[int] = set()
    for i, node in enumerate(tree.nodes):
        if node.id in ids:
            raise _Bad(f"nodes[{i}].id", f"node id {node.id} appears twice")
        ids.add(node.id)
    for i, node in enumerate(tree.nodes):
        if node.parent is not None and node.parent not in ids:
            raise _Bad(f"nodes[{i}].parent", f"no node has id {node.parent}")
    for i, traj in enumerate(tree.trajectories):
        if traj.leaf not in ids:
            raise _Bad(f"trajectories[{i}].leaf", f"no node has id {traj.leaf}")
        for j, nid in enumerate(traj.node_path):
            if nid not in ids:
                raise _Bad(f"trajectories[{i}].node_path[{j}]", f"no node has id {nid}")


def parse_tree(obj: Any) -> TreeView:
    """A validated :class:`TreeView` of one record (raises ``_Bad`` naming the field)."""
    tree = TreeView(**_fields(obj, TREE, ""))
    _check_links(tree)
    return tree


def load_step(path: Path) -> list[TreeView]:
    """The validated trees of one step file, read within rollout_log's caps; a bad record is a
    :class:`~tracerl.runs.rollout_log.RolloutRecordError` naming ``file:line`` and the field."""
    trees = []
    for number, obj in record_lines(path):
        try:
            trees.append(parse_tree(obj))
        except _Bad as bad:
            raise RolloutRecordError(f"{path}:{number}: {bad}") from None
    return trees
