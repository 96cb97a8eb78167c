"""Rollout executors: the execution side of planning apart from execution.

A scheme is a *planner*: it reads tree snapshots (and the success predictor) and emits requests
(:mod:`tracerl.core.protocol`); an *executor* runs them and answers with tree deltas. An executor
may live in another process (Ray actors, vLLM workers, a verl agent loop) or here
(:class:`LocalExecutor`, which wraps a :class:`~tracerl.rollout.engine.RolloutEngine` and the
frozen reference scorer). The trainer reaches its policy backend only through its executor.

Calls (trees are addressed by ``tree_id``):

- ``start([StartRequest])``: new trees, ``n`` chains each -> :class:`RolloutResult` of deltas;
- ``expand([ExpandRequest])``: ``k`` continuations from a node (branch indices from the driver);
- ``adopt([AdoptRequest])``: take over trees another executor produced (a restarted worker);
- ``prompt_states(tasks)``: the policy's hidden state at each prompt's last token, or None
  per prompt when the backend cannot record states (the predictor's ``hidden`` input at stage 1);
  a distributed executor computes them on the worker that will start those tasks' trees (the
  least-loaded one by planned rollouts, :mod:`tracerl.rollout.placement`);
- ``score([ScoreRequest])``: the reference readiness of node prefixes -> :class:`ScoreResult`;
- ``sync_weights(weights, version)``: the backend takes the trainer's new weights (a model, or
  ``(name, tensor)`` buckets, :func:`tracerl.models.weights.weight_buckets`);
- ``forget(tree_ids)``: drop the trees (they can no longer be expanded);
- ``evaluate``, ``clear_prefix_cache``, ``sleep`` / ``wake_up``: what the trainer needs of the
  backend between steps.

Requests carry the weights ``version``; an executor refuses one for a version it does not hold
(:class:`VersionError`, naming both), so no rollout is ever sampled from stale weights.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from tracerl.core.protocol import (
    AdoptRequest,
    ExpandRequest,
    RolloutCost,
    RolloutResult,
    ScoreRequest,
    ScoreResult,
    StartRequest,
    TreeDelta,
    apply_delta,
    task_from_record,
    tree_delta,
)
from tracerl.rollout.engine import RolloutEngine
from tracerl.rollout.evaluate import evaluate

ScoreFn = Callable[[Sequence[ScoreRequest]], ScoreResult]
"""``ReferenceScorer.score_nodes``: readiness of self-contained node requests (no tree needed)."""


class VersionError(ValueError):
    """A request asked for weights this executor does not hold."""


class RolloutExecutor(Protocol):
    """Runs rollout requests; see the module docstring."""

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]: ...

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]: ...

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult: ...

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult: ...

    def adopt(self, requests: Sequence[AdoptRequest]) -> None: ...

    def score(self, requests: Sequence[ScoreRequest]) -> ScoreResult: ...

    def sync_weights(self, weights: Any, version: int) -> None: ...

    def forget(self, tree_ids: Sequence[str]) -> None: ...

    def evaluate(self, tasks: Sequence[Any], samples: int = 1, seed: int = 0) -> dict[str, float]: ...

    def clear_prefix_cache(self) -> None: ...

    def eval_state(self) -> dict[str, int]: ...

    def load_eval_state(self, state: Mapping[str, int]) -> None: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None:
        """Release what the executor started (idempotent; the trainer calls it when it closes)."""
        ...


class LocalExecutor:
    """The in-process executor: a :class:`RolloutEngine` (with its backend), the reference
    scorer's ``score_nodes`` when credit or readiness-aware allocation is on, and an engine for
    evaluation (``eval_engine``: the same backend at the evaluation temperature).

    ``version`` is the weights version the backend holds (set by :meth:`sync_weights`)."""

    def __init__(self, engine: RolloutEngine, score: ScoreFn | None = None, *, eval_engine: RolloutEngine | None = None,
                 worker: str = "local", version: int = 0) -> None:
        self.engine = engine
        self.scorer = score
        self.eval_engine = eval_engine
        self.worker = worker
        self.version = int(version)
        self._sent: dict[str, int] = {}  # nodes of each tree already sent in a delta

    @property
    def backend(self) -> Any:
        return self.engine.backend

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]:
        return [self.engine.prompt_ids(task_from_record(t)) for t in tasks]

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]:
        """One prefill of the prompts on backends that record states (HF); None per prompt otherwise.
        The prefill's KV is kept, so starting trees from these prompts afterwards reuses it."""
        record = getattr(self.backend, "prefix_states", None)
        states = record(self.prompt_ids(tasks)) if callable(record) and tasks else None
        return list(states) if states is not None else [None] * len(tasks)

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult:
        """Requests sharing a seed run as one engine call (one batch); others one call per seed."""
        self._check_version(requests, "start")
        call = _Call(self)
        deltas, cost = [], RolloutCost()
        for seed in dict.fromkeys(r.seed for r in requests):
            group = [r for r in requests if r.seed == seed]
            for r in group:
                self._sent.pop(r.tree_id, None)
            trees, part = self.engine.rollout([task_from_record(r.task) for r in group], [r.n for r in group],
                                              tree_ids=[r.tree_id for r in group], seed=seed)
            cost = cost + part
            deltas += [self._delta(tree.tree_id) for tree in trees]
        return call.result(deltas, cost)

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult:
        self._check_version(requests, "expand")
        call = _Call(self)
        cost = RolloutCost()
        for seed in dict.fromkeys(r.seed for r in requests):
            group = [(r.tree_id, r.node_id, r.k, r.first_branch) for r in requests if r.seed == seed]
            cost = cost + self.engine.expand(group, seed=seed)
        touched = list(dict.fromkeys(r.tree_id for r in requests))
        return call.result([self._delta(t) for t in touched], cost)

    def adopt(self, requests: Sequence[AdoptRequest]) -> None:
        """Hold the driver's trees as if produced here (episodes replayed without tool calls, branch
        counters and the delta cursor from the driver), so they can be expanded here."""
        for req in requests:
            trees: dict[str, Any] = {}
            tree = apply_delta(trees, req.tree)
            self.engine.adopt(tree, task_from_record(req.task), {int(k): v for k, v in req.branches.items()})
            self._sent[tree.tree_id] = len(tree.nodes)

    def score(self, requests: Sequence[ScoreRequest]) -> ScoreResult:
        """Readiness of every requested node prefix (one batched scorer call)."""
        if self.scorer is None:
            raise ValueError("this executor has no reference scorer (readiness needs algo.credit = true)")
        return self.scorer(requests) if requests else ScoreResult()

    def sync_weights(self, weights: Any, version: int) -> None:
        """The backend takes ``weights`` (the trainer's model or ``(name, tensor)`` buckets)."""
        self.backend.sync_weights(weights, version)
        self.version = int(version)

    def forget(self, tree_ids: Sequence[str]) -> None:
        self.engine.forget(list(tree_ids))
        for t in tree_ids:
            self._sent.pop(t, None)

    # --- between steps ---------------------------------------------------------------------

    def evaluate(self, tasks: Sequence[Any], samples: int = 1, seed: int = 0) -> dict[str, float]:
        """Metrics of :func:`~tracerl.rollout.evaluate.evaluate` on ``tasks`` with a generator seeded
        ``seed``; then the prefix cache is cleared (evaluation's prefixes must not serve training:
        KV recomputed in other batch shapes may differ in the last bits on a GPU) and the tool calls
        it made are dropped (they say nothing about a training step)."""
        if self.eval_engine is None:
            raise ValueError("this executor was built without an evaluation engine")
        report = evaluate(self.eval_engine, list(tasks), samples=samples, generator=torch.Generator().manual_seed(seed))
        self.clear_prefix_cache()
        _take_tool_stats(self.engine.env)
        return report.metrics

    def eval_state(self) -> dict[str, int]:
        """What seeds the next evaluation's episodes (checkpointed, so a resumed run evaluates on the
        same draws): the evaluation engine's count of trees started (tree ids carry it)."""
        return {"trees_started": self.eval_engine.trees_started if self.eval_engine is not None else 0}

    def load_eval_state(self, state: Mapping[str, int]) -> None:
        if self.eval_engine is not None:
            self.eval_engine.trees_started = int(state.get("trees_started", 0))

    def clear_prefix_cache(self) -> None:
        self.backend.clear_prefix_cache()

    def close(self) -> None:
        """Nothing to release: the engine and its backend belong to whoever built them."""

    def sleep(self, level: int = 1) -> None:
        """Free the backend's accelerator memory for the update (vLLM sleep mode)."""
        if not callable(getattr(self.backend, "sleep", None)):
            raise ValueError(f"the {type(self.backend).__name__} backend cannot sleep (model.vllm_sleep needs vllm)")
        self.backend.sleep(level=level)

    def wake_up(self) -> None:
        self.backend.wake_up()

    # --- internals --------------------------------------------------------------------------

    def _check_version(self, requests: Sequence[StartRequest | ExpandRequest], call: str) -> None:
        for r in requests:
            if r.version != self.version:
                raise VersionError(f"{call} of tree {r.tree_id!r} asks for weights version {r.version}; "
                                   f"executor {self.worker!r} holds version {self.version}")

    def _delta(self, tree_id: str) -> TreeDelta:
        tree = self.engine.tree(tree_id)
        first = self._sent.get(tree_id, 1)
        self._sent[tree_id] = len(tree.nodes)
        return tree_delta(tree, first)


class _Call:
    """What one start/expand call did: wall time, tool calls, backend counters."""

    def __init__(self, executor: LocalExecutor) -> None:
        self.executor = executor
        _take_tool_stats(executor.engine.env)  # calls made outside executor calls are not this call's
        self.stats = dict(getattr(executor.backend, "stats", {}) or {})
        self.clock = time.perf_counter()

    def result(self, deltas: list[TreeDelta], cost: RolloutCost) -> RolloutResult:
        ex = self.executor
        now = dict(getattr(ex.backend, "stats", {}) or {})
        return RolloutResult(deltas, cost.rollouts, cost.generated_tokens, version=ex.version, worker=ex.worker,
                             seconds=time.perf_counter() - self.clock, tool_stats=_take_tool_stats(ex.engine.env),
                             backend_stats={k: int(v) - int(self.stats.get(k, 0)) for k, v in now.items()})


def _take_tool_stats(env: Any) -> dict[str, Any]:
    """The environment's tool counters since the last take, as a plain dict (``{}`` when the
    environment keeps none)."""
    take = getattr(env, "take_tool_stats", None)
    return dataclasses.asdict(take()) if callable(take) else {}
