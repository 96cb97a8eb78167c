"""The records that cross between planning (the driver) and execution (rollout executors).

A planner (a rollout scheme, through a ``RolloutSession``) sends requests; an executor runs them
and answers with tree deltas. Everything here is a plain dataclass of ints, floats, strings,
bytes, lists and dicts (JSON- and pickle-able: :func:`to_json` / :func:`from_json`), so an
executor can live in another process (Ray actors, vLLM workers, a verl agent loop) as well as in
this one. The planning side needs only this module and :mod:`tracerl.core.types`: a driver that
plans never imports model code.

- :class:`StartRequest` / :class:`ExpandRequest`: new trees, and continuations of a node. Both
  carry the weights ``version`` they must run under (an executor holding another refuses them);
  an expansion carries ``first_branch``, the branch index of its first continuation at that node,
  counted by the driver, so which executor runs it changes nothing (seeds derive from it).
- :class:`RolloutResult`: :class:`TreeDelta` per touched tree, the cost, and what the call did
  (version, worker, seconds, tool calls as ``dataclasses.asdict(ToolStats)``, backend counters).
- :class:`AdoptRequest`: a tree an executor did not produce (a restarted worker), sent whole by
  the driver with its branch counters, so the executor can rebuild its state and expand it.
- :class:`ScoreRequest` / :class:`ScoreResult`: readiness of tree nodes, self-contained (prefix
  token ids and the gold answer), so it can be scored where the tree is not.

Hidden states cross as float32 bytes (:func:`pack_floats`), not JSON float lists.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracerl.core.seeds import derive_seed
from tracerl.core.types import Action, RolloutTree, Task, Trajectory, Turn


# --------------------------------------------------------------------------- cost
@dataclass
class RolloutCost:
    """Sampling cost (spec section 1): continuation rollouts and policy-generated tokens."""

    rollouts: int = 0
    generated_tokens: int = 0

    def __add__(self, other: RolloutCost) -> RolloutCost:
        return RolloutCost(self.rollouts + other.rollouts, self.generated_tokens + other.generated_tokens)


# --------------------------------------------------------------------------- requests
@dataclass
class StartRequest:
    """Start tree ``tree_id`` for ``task`` (``Task`` fields as a dict) with ``n`` chains
    (branches ``0..n-1`` of the root)."""

    tree_id: str
    task: dict[str, Any]
    n: int
    seed: int
    version: int = 0
    """Weights version the chains must be sampled with (the trainer's optimiser step)."""


@dataclass
class ExpandRequest:
    """``k`` continuations from node ``node_id`` of tree ``tree_id``: branches
    ``first_branch .. first_branch + k - 1`` of that node (None: the executor's own count)."""

    tree_id: str
    node_id: int
    k: int
    seed: int
    first_branch: int | None = None
    version: int = 0


@dataclass
class NodeRecord:
    """One node: its parent and turn (``Turn`` as a dict), recorded state and readiness."""

    parent: int
    turn: dict[str, Any]
    hidden: bytes | None = None
    """The node's recorded policy state (``Node.hidden``) as float32 bytes, if any."""
    readiness: float | None = None


@dataclass
class TreeDelta:
    """What one call added to one tree. ``prompt_ids`` is set when the tree is new."""

    tree_id: str
    task_id: str
    first_node: int
    nodes: list[NodeRecord] = field(default_factory=list)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    """``Trajectory`` dicts of the new leaves (each names its leaf in ``node_path[-1]``)."""
    prompt_ids: list[int] | None = None
    root_hidden: bytes | None = None
    """The new tree's root state (``Node.hidden`` of node 0) as float32 bytes, sent with ``prompt_ids``."""
    root_readiness: float | None = None


@dataclass
class RolloutResult:
    """The answer to ``start`` / ``expand``: deltas in request order (first touch) and what it cost."""

    deltas: list[TreeDelta]
    rollouts: int = 0
    generated_tokens: int = 0
    version: int = 0
    """Weights version the call ran under."""
    worker: str = ""
    seconds: float = 0.0
    tool_stats: dict[str, Any] = field(default_factory=dict)
    """The call's tool calls and failures: ``dataclasses.asdict(ToolStats)`` (the trainer rebuilds
    it with ``ToolStats(**record)``; the planning side never imports environments)."""
    backend_stats: dict[str, int] = field(default_factory=dict)
    """Increase of the backend's counters (``prefill_tokens``, ``reused_prefix_tokens``, ...) in the call."""


@dataclass
class AdoptRequest:
    """Take over tree ``tree.tree_id`` (a delta holding the whole tree, ``first_node == 1``).

    ``branches[str(node_id)]`` is the number of continuations started from each node so far (the
    next branch index there), as the driver counted them."""

    task: dict[str, Any]
    tree: TreeDelta
    branches: dict[str, int] = field(default_factory=dict)


@dataclass
class ScoreRequest:
    """Readiness of nodes ``node_ids`` of tree ``tree_id``: ``prefixes[i]`` is the token ids of
    node ``node_ids[i]``'s prefix (prompt + turns), ``gold`` the task's gold answer ``y*``."""

    tree_id: str
    task_id: str
    gold: str
    node_ids: list[int]
    prefixes: list[list[int]]


@dataclass
class ScoreResult:
    """Readiness per tree: ``nodes[tree_id][str(node_id)] = l`` and per leaf the trajectory's list."""

    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    trajectories: dict[str, dict[str, list[float]]] = field(default_factory=dict)


# --------------------------------------------------------------------------- wire format
def pack_floats(values: Sequence[float] | None) -> bytes | None:
    """A float vector as little-endian float32 bytes (4 bytes a value instead of ~20 in JSON)."""
    return None if values is None else np.asarray(values, dtype="<f4").tobytes()


def unpack_floats(data: bytes | None) -> list[float] | None:
    """The inverse of :func:`pack_floats` (exact for values that are float32 already)."""
    return None if data is None else np.frombuffer(data, dtype="<f4").astype(np.float64).tolist()


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not a protocol value")


def _decode(obj: dict[str, Any]) -> Any:
    return base64.b64decode(obj["__bytes__"]) if set(obj) == {"__bytes__"} else obj


def to_json(record: Any) -> str:
    """A protocol record as JSON (bytes as base64)."""
    return json.dumps(dataclasses.asdict(record), default=_encode)


def _delta(data: Mapping[str, Any]) -> TreeDelta:
    return TreeDelta(**{**data, "nodes": [NodeRecord(**n) for n in data["nodes"]]})


def from_json(cls: type, text: str) -> Any:
    """Rebuild a protocol record of type ``cls`` from :func:`to_json`'s output."""
    data = json.loads(text, object_hook=_decode)
    if cls is RolloutResult:
        return RolloutResult(**{**data, "deltas": [_delta(d) for d in data["deltas"]]})
    if cls is TreeDelta:
        return _delta(data)
    if cls is AdoptRequest:
        return AdoptRequest(**{**data, "tree": _delta(data["tree"])})
    return cls(**data)


def task_record(task: Task) -> dict[str, Any]:
    """``task`` as plain JSON types (its tuple fields become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(task).items()}


def task_from_record(data: Mapping[str, Any]) -> Task:
    """The inverse of :func:`task_record` (lists back to the tuples ``Task`` holds)."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return Task(**fields)


def turn_from_record(data: Mapping[str, Any]) -> Turn:
    return Turn(**{**data, "action": Action(**data["action"])})


def trajectory_from_record(data: Mapping[str, Any]) -> Trajectory:
    return Trajectory(**{**data, "turns": [turn_from_record(t) for t in data["turns"]]})


# --------------------------------------------------------------------------- routing
def worker_of(task_id: str, workers: int) -> int:
    """A stable hash of the task id onto ``workers``: the same worker in every process and run.
    The Ray executor places tasks by planned work instead (:mod:`tracerl.rollout.placement`);
    this is the baseline that placement is measured against."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return derive_seed("owner", task_id) % workers


# --------------------------------------------------------------------------- trees
def tree_delta(tree: RolloutTree, first: int = 1) -> TreeDelta:
    """Nodes ``first..`` of ``tree`` and the trajectories of their leaves (``first == 1``: the
    whole tree, prompt and root included; :func:`apply_delta` rebuilds it)."""
    nodes = [NodeRecord(n.parent, dataclasses.asdict(n.turn), pack_floats(n.hidden), n.readiness)  # type: ignore[arg-type]
             for n in tree.nodes[first:]]
    trajectories = [dataclasses.asdict(t) for leaf, t in sorted(tree.trajectories.items()) if leaf >= first]
    new = first == 1
    return TreeDelta(tree.tree_id, tree.task_id, first, nodes, trajectories,
                     prompt_ids=list(tree.prompt_ids) if new else None,
                     root_hidden=pack_floats(tree.root.hidden) if new else None,
                     root_readiness=tree.root.readiness if new else None)


def apply_delta(trees: dict[str, RolloutTree], delta: TreeDelta) -> RolloutTree:
    """Append ``delta`` to ``trees[delta.tree_id]`` (created from ``prompt_ids`` when new)."""
    if delta.prompt_ids is not None:
        trees[delta.tree_id] = RolloutTree(delta.tree_id, delta.task_id, list(delta.prompt_ids))
        trees[delta.tree_id].root.hidden = unpack_floats(delta.root_hidden)
        trees[delta.tree_id].root.readiness = delta.root_readiness
    tree = trees[delta.tree_id]
    if delta.first_node != len(tree.nodes):
        raise ValueError(f"delta for {delta.tree_id!r} starts at node {delta.first_node}, "
                         f"the tree holds {len(tree.nodes)} nodes (a delta was lost or applied twice)")
    for rec in delta.nodes:
        node = tree.nodes[tree.add_child(rec.parent, turn_from_record(rec.turn))]
        node.hidden, node.readiness = unpack_floats(rec.hidden), rec.readiness
    for data in delta.trajectories:
        tree.add_leaf(data["node_path"][-1], trajectory_from_record(data))
    return tree


def boundary_nodes(traj: Trajectory) -> list[int]:
    """Tree node ids of the boundaries ``S_0..S_T`` of a tree's trajectory (where readiness is scored)."""
    return [traj.node_path[0]] + [traj.node_path[i + 1] for i, t in enumerate(traj.turns) if t.is_transition]


def score_requests(trees: Sequence[RolloutTree], tasks: Mapping[str, Task]) -> list[ScoreRequest]:
    """One :class:`ScoreRequest` per tree with unscored boundary nodes on its unscored,
    non-infra-failed trajectories (each node once, in id order); trees with none are left out."""
    out = []
    for tree in trees:
        wanted = sorted({n for t in tree.trajectories.values() if t.readiness is None and not t.infra_failed
                         for n in boundary_nodes(t) if tree.nodes[n].readiness is None})
        if wanted:
            out.append(ScoreRequest(tree.tree_id, tree.task_id, tasks[tree.task_id].gold, wanted,
                                    [tree.prefix_ids(n) for n in wanted]))
    return out


def apply_scores(trees: Sequence[RolloutTree], result: ScoreResult) -> None:
    """Write ``result``'s node readiness on ``trees``, then each unscored trajectory's list from its
    boundary nodes (when they all hold one) and any trajectory lists ``result`` names."""
    for tree in trees:
        for nid, value in result.nodes.get(tree.tree_id, {}).items():
            tree.nodes[int(nid)].readiness = float(value)
        for leaf, values in result.trajectories.get(tree.tree_id, {}).items():
            tree.trajectories[int(leaf)].readiness = list(values)
        for traj in tree.trajectories.values():
            found = [tree.nodes[n].readiness for n in boundary_nodes(traj)]
            if traj.readiness is None and not traj.infra_failed and None not in found:
                traj.readiness = [float(v) for v in found if v is not None]
