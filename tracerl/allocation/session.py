"""The driver's side of the executor protocol: one step's trees, as planners see them.

A :class:`RolloutSession` turns a planner's decisions into protocol requests
(:mod:`tracerl.core.protocol`) for a rollout executor and applies the returned deltas to its own
copies of the trees (the snapshots planners read). It holds what makes requests independent of
the executor that runs them:

- the step's seed (every request carries it; the executor derives one seed per episode and turn
  from it, the tree id, the node and the branch index);
- the branch counters: how many continuations each node has had, so every expansion carries its
  ``first_branch`` and the same expansions sent to one executor or split over several give the
  same episodes;
- the weights ``version`` the step samples with (an executor holding another refuses).

It also logs every expansion request, collects what each result reports (tool calls as plain
dicts, backend counters) and can hand its trees to another executor (:meth:`adopt_requests`).
It imports only :mod:`tracerl.core`: a driver plans without model code.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from tracerl.core.protocol import (
    AdoptRequest,
    ExpandRequest,
    RolloutCost,
    RolloutResult,
    StartRequest,
    apply_delta,
    apply_scores,
    score_requests,
    task_record,
    tree_delta,
)
from tracerl.core.types import RolloutTree, Task


class RolloutSession:
    """One step of rollouts through ``executor`` with seed ``seed`` under weights ``version``."""

    def __init__(self, executor: Any, seed: int, version: int = 0) -> None:
        self.executor = executor
        self.seed = int(seed)
        self.version = int(version)
        self.trees: dict[str, RolloutTree] = {}
        self.tasks: dict[str, Task] = {}
        """Task of each task id started in this session (the gold answers of score requests)."""
        self.branches: dict[tuple[str, int], int] = {}
        """Continuations started so far from each ``(tree id, node id)``: the next branch index."""
        self.expansions: list[tuple[str, int, int]] = []
        """Every expansion request, in order: (tree id, node id, continuations); node 0 = root."""
        self.seconds: dict[str, float] = {"execute": 0.0, "score": 0.0}
        """Wall time inside the executor: ``execute`` (start + expand) and ``score`` (readiness).
        The rest of a scheme's ``collect`` is planning (predictor calls, allocation)."""
        self.tool_stats: list[dict[str, Any]] = []
        """Each result's tool counters (``dataclasses.asdict(ToolStats)``), in call order."""
        self.backend_stats: dict[str, int] = {}
        """Backend counters summed over the results."""

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
        """New trees (one per task, ``n[i]`` chains each: branches ``0..n[i]-1`` of the root), in ``tasks`` order."""
        if not len(tasks) == len(n) == len(tree_ids):
            raise ValueError(f"{len(tasks)} tasks, {len(n)} counts and {len(tree_ids)} tree ids must match")
        requests = [StartRequest(tid, task_record(t), int(k), self.seed, self.version)
                    for t, k, tid in zip(tasks, n, tree_ids, strict=True)]
        for t, k, tid in zip(tasks, n, tree_ids, strict=True):
            self.tasks[t.id] = t
            self.branches = {key: v for key, v in self.branches.items() if key[0] != tid}
            self.branches[(tid, 0)] = int(k)
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
        result = self.executor.expand(self.expand_requests(wanted))
        self.seconds["execute"] += time.perf_counter() - clock
        return self._apply(result)

    def expand_requests(self, wanted: Sequence[tuple[str, int, int]]) -> list[ExpandRequest]:
        """Protocol requests of ``(tree_id, node_id, k)`` entries, numbering their branches (this
        advances the counters: build them once per expansion)."""
        out = []
        for t, nid, k in wanted:
            first = self.branches.get((t, nid), 0)
            self.branches[(t, nid)] = first + k
            out.append(ExpandRequest(t, nid, k, self.seed, first_branch=first, version=self.version))
        return out

    def score(self, trees: Sequence[RolloutTree]) -> None:
        """Ask the executor for the readiness of the trees' unscored boundary nodes (self-contained
        :class:`~tracerl.core.protocol.ScoreRequest`: prefixes and gold answers, no tree needed on
        the scoring side); write it on these copies, trajectories included."""
        requests = score_requests(trees, self.tasks)
        clock = time.perf_counter()
        result = self.executor.score(requests)
        self.seconds["score"] += time.perf_counter() - clock
        apply_scores(trees, result)

    def adopt_requests(self, tree_ids: Sequence[str]) -> list[AdoptRequest]:
        """What another executor needs to take over ``tree_ids``: each tree whole, its task and the
        branch counters of its nodes."""
        return [AdoptRequest(task_record(self.tasks[self.trees[t].task_id]), tree_delta(self.trees[t]),
                             {str(nid): k for (tid, nid), k in sorted(self.branches.items()) if tid == t})
                for t in tree_ids]

    def forget(self) -> None:
        """Release the step's trees on the executor (the copies here stay usable)."""
        self.executor.forget(list(self.trees))

    def _apply(self, result: RolloutResult) -> RolloutCost:
        for delta in result.deltas:
            apply_delta(self.trees, delta)
        self.tool_stats.append(dict(result.tool_stats))
        for key, value in result.backend_stats.items():
            self.backend_stats[key] = self.backend_stats.get(key, 0) + int(value)
        return RolloutCost(result.rollouts, result.generated_tokens)


def as_session(target: Any, generator: torch.Generator | None = None, seed: int | None = None) -> RolloutSession:
    """A session on ``target``: a session (returned as is) or an executor (a ``LocalExecutor``
    wrapping a ``RolloutEngine``, say). Without ``seed`` the session's seed is one draw from
    ``generator`` (torch's global one when None)."""
    if isinstance(target, RolloutSession):
        return target
    if not callable(getattr(target, "start", None)):
        raise TypeError(f"a scheme runs on a RolloutSession or an executor, not a {type(target).__name__} "
                        "(wrap a RolloutEngine in tracerl.rollout.executor.LocalExecutor)")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return RolloutSession(target, seed)
