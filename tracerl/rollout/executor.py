"""The rollout executor protocol: planning (driver) apart from execution (executor).

A scheme is a *planner*: it reads tree snapshots (and the success predictor) and emits
requests; an *executor* runs them and answers with tree deltas. Everything that crosses the
boundary is a plain dataclass of ints, floats, strings, lists and dicts (JSON- and
pickle-able: :func:`to_json` / :func:`from_json`), so an executor can live in another process
(vLLM workers, Ray actors, a verl agent loop) as well as here (:class:`LocalExecutor`, which
wraps today's :class:`~tracerl.rollout.engine.RolloutEngine` and the frozen reference scorer).

Calls (trees are addressed by ``tree_id``):

- ``start([StartRequest])``: new trees, ``n`` chains each -> :class:`RolloutResult` of deltas;
- ``expand([ExpandRequest])``: ``k`` continuations from a node -> deltas;
- ``prompt_states(tasks)``: the policy's hidden state at each prompt's last token, or None
  per prompt when the backend cannot record states (the predictor's ``hidden`` input at stage 1);
- ``score(tree_ids)``: the reference readiness of every new node/trajectory -> :class:`ScoreResult`;
- ``sync_weights(weights, version)``: the backend takes the trainer's new weights;
- ``forget(tree_ids)``: drop the trees (they can no longer be expanded).

A delta lists the nodes a call appended to one tree (ids are positional: a delta's first
node has id ``first_node``) and the trajectories of its new leaves; the driver's
:class:`RolloutSession` applies it to its own copy of the tree, so driver and executor hold
equal trees without sharing objects.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracerl.core.types import Action, RolloutTree, Task, Trajectory, Turn
from tracerl.rollout.engine import RolloutCost, RolloutEngine

ScoreFn = Callable[[Sequence[RolloutTree], Mapping[str, Task]], object]
"""``ReferenceScorer.score``: writes readiness on the unscored trajectories and nodes of trees."""


# --------------------------------------------------------------------------- records
@dataclass
class StartRequest:
    """Start tree ``tree_id`` for ``task`` (``Task`` fields as a dict) with ``n`` chains."""

    tree_id: str
    task: dict[str, Any]
    n: int
    seed: int


@dataclass
class ExpandRequest:
    """``k`` continuations from node ``node_id`` of tree ``tree_id``."""

    tree_id: str
    node_id: int
    k: int
    seed: int


@dataclass
class NodeRecord:
    """One appended node: its parent and turn (``Turn`` as a dict)."""

    parent: int
    turn: dict[str, Any]
    hidden: list[float] | None = None
    """The node's recorded policy state (``Node.hidden``), if any."""


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
    root_hidden: list[float] | None = None
    """The new tree's root state (``Node.hidden`` of node 0), sent with ``prompt_ids``."""


@dataclass
class RolloutResult:
    deltas: list[TreeDelta]
    rollouts: int = 0
    generated_tokens: int = 0


@dataclass
class ScoreResult:
    """Readiness per tree: ``nodes[tree_id][str(node_id)] = l`` and per leaf the trajectory's list."""

    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    trajectories: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def to_json(record: Any) -> str:
    """A protocol record as JSON."""
    return json.dumps(dataclasses.asdict(record))


def from_json(cls: type, text: str) -> Any:
    """Rebuild a protocol record of type ``cls`` from :func:`to_json`'s output."""
    data = json.loads(text)
    if cls is RolloutResult:
        deltas = [TreeDelta(**{**d, "nodes": [NodeRecord(**n) for n in d["nodes"]]}) for d in data["deltas"]]
        return RolloutResult(deltas, data["rollouts"], data["generated_tokens"])
    if cls is TreeDelta:
        return TreeDelta(**{**data, "nodes": [NodeRecord(**n) for n in data["nodes"]]})
    return cls(**data)


def task_record(task: Task) -> dict[str, Any]:
    """``task`` as plain JSON types (its tuple fields become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(task).items()}


def task_from_record(data: Mapping[str, Any]) -> Task:
    """The inverse of :func:`task_record` (lists back to the tuples ``Task`` holds)."""
    return Task(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def turn_from_record(data: Mapping[str, Any]) -> Turn:
    return Turn(**{**data, "action": Action(**data["action"])})


def trajectory_from_record(data: Mapping[str, Any]) -> Trajectory:
    return Trajectory(**{**data, "turns": [turn_from_record(t) for t in data["turns"]]})


def apply_delta(trees: dict[str, RolloutTree], delta: TreeDelta) -> RolloutTree:
    """Append ``delta`` to ``trees[delta.tree_id]`` (created from ``prompt_ids`` when new)."""
    if delta.prompt_ids is not None:
        trees[delta.tree_id] = RolloutTree(delta.tree_id, delta.task_id, list(delta.prompt_ids))
        trees[delta.tree_id].root.hidden = delta.root_hidden
    tree = trees[delta.tree_id]
    if delta.first_node != len(tree.nodes):
        raise ValueError(f"delta for {delta.tree_id!r} starts at node {delta.first_node}, "
                         f"the tree holds {len(tree.nodes)} nodes (a delta was lost or applied twice)")
    for rec in delta.nodes:
        tree.nodes[tree.add_child(rec.parent, turn_from_record(rec.turn))].hidden = rec.hidden
    for data in delta.trajectories:
        tree.add_leaf(data["node_path"][-1], trajectory_from_record(data))
    return tree


# --------------------------------------------------------------------------- protocol
class RolloutExecutor(Protocol):
    """Runs rollout requests; see the module docstring."""

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]: ...

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]: ...

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult: ...

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult: ...

    def score(self, tree_ids: Sequence[str]) -> ScoreResult: ...

    def sync_weights(self, weights: Any, version: int) -> None: ...

    def forget(self, tree_ids: Sequence[str]) -> None: ...


class LocalExecutor:
    """The in-process executor: a :class:`RolloutEngine` (with its backend) and, when credit or
    readiness-aware allocation is on, the reference scorer's batched ``score``."""

    def __init__(self, engine: RolloutEngine, score: ScoreFn | None = None) -> None:
        self.engine = engine
        self.scorer = score
        self._sent: dict[str, int] = {}  # nodes of each tree already sent in a delta

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]:
        return [self.engine.prompt_ids(task_from_record(t)) for t in tasks]

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]:
        """One prefill of the prompts on backends that record states (HF); None per prompt otherwise.
        The prefill's KV is kept, so starting trees from these prompts afterwards reuses it."""
        record = getattr(self.engine.backend, "prefix_states", None)
        states = record(self.prompt_ids(tasks)) if callable(record) and tasks else None
        return list(states) if states is not None else [None] * len(tasks)

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult:
        """Requests sharing a seed run as one engine call (one batch); others one call per seed."""
        deltas, cost = [], RolloutCost()
        for seed in dict.fromkeys(r.seed for r in requests):
            group = [r for r in requests if r.seed == seed]
            for r in group:
                self._sent.pop(r.tree_id, None)
            trees, part = self.engine.rollout([task_from_record(r.task) for r in group], [r.n for r in group],
                                              tree_ids=[r.tree_id for r in group], seed=seed)
            cost = cost + part
            deltas += [self._delta(tree.tree_id) for tree in trees]
        return RolloutResult(deltas, cost.rollouts, cost.generated_tokens)

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult:
        cost = RolloutCost()
        for seed in dict.fromkeys(r.seed for r in requests):
            group = [(r.tree_id, r.node_id, r.k) for r in requests if r.seed == seed]
            cost = cost + self.engine.expand(group, seed=seed)  # type: ignore[arg-type]
        touched = list(dict.fromkeys(r.tree_id for r in requests))
        return RolloutResult([self._delta(t) for t in touched], cost.rollouts, cost.generated_tokens)

    def score(self, tree_ids: Sequence[str]) -> ScoreResult:
        """Readiness of every unscored trajectory of the trees (one batched scorer call)."""
        if self.scorer is None:
            raise ValueError("this executor has no reference scorer (readiness needs algo.credit = true)")
        trees = [self.engine.tree(t) for t in tree_ids]
        self.scorer(trees, {t.task_id: self.engine.task(t.tree_id) for t in trees})
        result = ScoreResult()
        for tree in trees:
            result.nodes[tree.tree_id] = {str(n.id): n.readiness for n in tree.nodes if n.readiness is not None}
            result.trajectories[tree.tree_id] = {
                str(leaf): list(traj.readiness) for leaf, traj in tree.trajectories.items() if traj.readiness is not None
            }
        return result

    def sync_weights(self, weights: Any, version: int) -> None:
        self.engine.backend.sync_weights(weights, version)

    def forget(self, tree_ids: Sequence[str]) -> None:
        self.engine.forget(list(tree_ids))
        for t in tree_ids:
            self._sent.pop(t, None)

    def _delta(self, tree_id: str) -> TreeDelta:
        tree = self.engine.tree(tree_id)
        first = self._sent.get(tree_id, 1)
        self._sent[tree_id] = len(tree.nodes)
        nodes = [NodeRecord(n.parent, dataclasses.asdict(n.turn), n.hidden)  # type: ignore[arg-type]
                 for n in tree.nodes[first:]]
        trajectories = [dataclasses.asdict(t) for leaf, t in sorted(tree.trajectories.items()) if leaf >= first]
        return TreeDelta(tree_id, tree.task_id, first, nodes, trajectories,
                         prompt_ids=list(tree.prompt_ids) if first == 1 else None,
                         root_hidden=tree.root.hidden if first == 1 else None)
