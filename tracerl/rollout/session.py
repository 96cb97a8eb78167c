"""The driver's side of the executor protocol: one step's trees, as planners see them.

A :class:`RolloutSession` turns a planner's decisions into protocol requests for a
:class:`~tracerl.rollout.executor.RolloutExecutor` and applies the returned deltas to its own
copies of the trees (the snapshots planners read). It also holds the step's seed (every
request carries it; the executor derives one seed per episode and turn from it, the tree id,
the node and the branch index) and logs every expansion request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from tracerl.core.types import RolloutTree, Task
from tracerl.rollout.engine import RolloutCost, RolloutEngine
from tracerl.rollout.executor import (
    ExpandRequest,
    LocalExecutor,
    RolloutExecutor,
    RolloutResult,
    ScoreFn,
    StartRequest,
    apply_delta,
    task_record,
)


class RolloutSession:
    """One step of rollouts through ``executor`` with seed ``seed``."""

    def __init__(self, executor: RolloutExecutor, seed: int) -> None:
        self.executor = executor
        self.seed = int(seed)
        self.trees: dict[str, RolloutTree] = {}
        self.expansions: list[tuple[str, int, int]] = []
        """Every expansion request, in order: (tree id, node id, continuations); node 0 = root."""
        self.seconds: dict[str, float] = {"execute": 0.0, "score": 0.0}
        """Wall time inside the executor: ``execute`` (start + expand) and ``score`` (readiness).
        The rest of a scheme's ``collect`` is planning (predictor calls, allocation)."""

    def prompt_ids(self, tasks: Sequence[Task]) -> list[list[int]]:
        """Prompt token ids ``S_0`` of ``tasks`` as the executor's trees start with them."""
        return self.executor.prompt_ids([task_record(t) for t in tasks])

    def prompt_states(self, tasks: Sequence[Task]) -> list[list[float] | None]:
        """The policy's hidden state at each prompt's last token (None where the backend has none)."""
        clock = time.perf_counter()
        states = self.executor.prompt_states([task_record(t) for t in tasks])
        self.seconds["execute"] += time.perf_counter() - clock
        return states

    def start(self, tasks: Sequence[Task], n: Sequence[int], tree_ids: Sequence[str]) -> tuple[list[RolloutTree], RolloutCost]:
        """New trees (one per task, ``n[i]`` chains each), in ``tasks`` order."""
        if not len(tasks) == len(n) == len(tree_ids):
            raise ValueError(f"{len(tasks)} tasks, {len(n)} counts and {len(tree_ids)} tree ids must match")
        requests = [StartRequest(tid, task_record(t), int(k), self.seed) for t, k, tid in zip(tasks, n, tree_ids)]
        clock = time.perf_counter()
        result = self.executor.start(requests)
        self.seconds["execute"] += time.perf_counter() - clock
        cost = self._apply(result)
        return [self.trees[tid] for tid in tree_ids], cost

    def expand(self, requests: Sequence[tuple[str, int, int]]) -> RolloutCost:
        """``k`` continuations from each ``(tree_id, node_id, k)`` (``k = 0`` entries are dropped)."""
        wanted = [(t, nid, int(k)) for t, nid, k in requests if k > 0]
        if not wanted:
            return RolloutCost()
        self.expansions += wanted
        clock = time.perf_counter()
        result = self.executor.expand([ExpandRequest(t, nid, k, self.seed) for t, nid, k in wanted])
        self.seconds["execute"] += time.perf_counter() - clock
        return self._apply(result)

    def score(self, trees: Sequence[RolloutTree]) -> None:
        """Ask the executor for the readiness of the trees' new nodes; write it on these copies."""
        clock = time.perf_counter()
        result = self.executor.score([t.tree_id for t in trees])
        self.seconds["score"] += time.perf_counter() - clock
        for tree in trees:
            for nid, value in result.nodes.get(tree.tree_id, {}).items():
                tree.nodes[int(nid)].readiness = value
            for leaf, values in result.trajectories.get(tree.tree_id, {}).items():
                tree.trajectories[int(leaf)].readiness = list(values)

    def forget(self) -> None:
        """Release the step's trees on the executor (the copies here stay usable)."""
        self.executor.forget(list(self.trees))

    def _apply(self, result: RolloutResult) -> RolloutCost:
        for delta in result.deltas:
            apply_delta(self.trees, delta)
        return RolloutCost(result.rollouts, result.generated_tokens)


def as_session(target: Any, generator: torch.Generator | None = None, seed: int | None = None,
               score: ScoreFn | None = None) -> RolloutSession:
    """A session on ``target``: a session (returned as is), an executor, or a bare
    :class:`RolloutEngine` (wrapped in a :class:`LocalExecutor` with ``score``).

    Without ``seed`` the session's seed is one draw from ``generator`` (torch's global one when None).
    """
    if isinstance(target, RolloutSession):
        return target
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    executor = LocalExecutor(target, score) if isinstance(target, RolloutEngine) else target
    return RolloutSession(executor, seed)
