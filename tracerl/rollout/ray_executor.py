"""``RayExecutor``: rollouts on Ray actors, each holding a :class:`~tracerl.rollout.executor.LocalExecutor`.

The driver (the trainer's process) plans; ``rollout.workers`` actors in one placement group
execute. Each actor builds its executor with the builder a plain-data
:class:`~tracerl.rollout.worker_spec.WorkerSpec` names (it loads the initial policy; weights follow
with each ``sync_weights``). This module imports Ray; nothing else in tracerl does, and it loads
no model code on the driver (the actors import it).

- Ownership: a task's trees live on one worker, chosen when its first tree starts by planned
  work (:func:`~tracerl.rollout.placement.place`: the least-loaded worker by rollouts requested,
  preferring the worker that prefilled its prompt on a tie); the task stays there while any of its
  trees lives, so every expansion of a tree reaches the worker holding it. Tokens do not depend
  on placement (seeds are per tree and branch). Calls fan out in parallel; the merged result lists
  the deltas in request order (first touch), as one executor would.
- The driver keeps a copy of every tree it has results for (deltas applied in request order),
  its task and branch counters: what an adopting worker needs.
- Faults: a worker that dies, or has not answered within ``rollout.request_timeout_s``, is
  killed and replaced by a fresh actor in its bundle; the replacement takes the last weights,
  adopts the dead worker's trees (``adopt``: episodes replayed without tool calls) and gets the
  failed call's requests again, unchanged (same seeds and branch indices), so the step ends with
  the trees it would have had; a failed call returned nothing, so nothing is counted twice.
  ``rollout.max_worker_restarts`` replacements per worker; then :class:`WorkerLostError`.
- Weights: ``(name, tensor)`` buckets in the policy's dtype (``model.dtype``: a bf16 policy's
  float32 master weights travel as 2 bytes per parameter) through ``rollout.weight_sync``
  (:mod:`tracerl.rollout.weight_sync`), streamed: each bucket is built (gathered and cast), put
  once in the object store (one copy per node) and loaded by every worker before the bucket after
  next is built, so the driver builds one bucket at a time and the object store holds two. A replacement worker is streamed the
  same weights from the same source. The backends clear their prefix caches on every sync.

:meth:`RayExecutor.take_metrics` gives the step's ``time_sync_weights``, ``sync_bytes``, ``sync_s_per_gb``,
``worker_failures``, ``requests_retried``, ``worker_imbalance`` (busiest worker's planned
rollouts over the mean) and each worker's generated tokens per second.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tracerl.core.protocol import (
    AdoptRequest,
    ExpandRequest,
    RolloutResult,
    ScoreRequest,
    ScoreResult,
    StartRequest,
    apply_delta,
    tree_delta,
)
from tracerl.core.types import RolloutTree
from tracerl.errors import UserError
from tracerl.rollout.progress import current_progress
from tracerl.rollout.placement import imbalance, in_request_order, place
from tracerl.rollout.ray_cluster import check_placeable, connect, free_resources
from tracerl.rollout.ray_worker import RolloutWorker, with_absolute_paths
from tracerl.rollout.weight_sync import broadcast, bucket_bytes, pack, sync_group, sync_store
from tracerl.rollout.worker_spec import WorkerSpec

ScoreFn = Callable[[Sequence[ScoreRequest]], ScoreResult]
_FAULTS = (RayActorError, GetTimeoutError)
"""What makes a worker failed (dead, or silent past the timeout); errors its executor raises
(a refused version, a bad request) reach the caller as they are."""


_ACTOR: Any = None  # the Ray actor class of RolloutWorker (made once per process)


class WorkerLostError(UserError):
    """A rollout worker failed more often than ``rollout.max_worker_restarts`` allows."""


class RayExecutor:
    """The rollout executor protocol over Ray actors (see the module docstring).

    ``score``: the driver's readiness scorer (``rollout.readiness_on = driver``), else None."""

    def __init__(self, spec: WorkerSpec, score: ScoreFn | None = None) -> None:
        rollout = spec.config["rollout"]
        self.spec = spec = with_absolute_paths(spec)
        self.n = int(rollout.get("workers", 1))
        self.weight_sync = str(rollout.get("weight_sync", "object_store"))
        self.readiness_on = str(rollout.get("readiness_on", "driver"))
        self.timeout = float(rollout.get("request_timeout_s", 600.0))
        self.max_restarts = int(rollout.get("max_worker_restarts", 3))
        self.build_timeout = max(self.timeout, 600.0)  # building a worker (loading a model) is not a request
        self.driver_score = score
        self.version = int(spec.version)
        self.sync_dtype = getattr(torch, str(spec.config.get("model", {}).get("dtype", "float32")))
        self.bucket_bytes = int(rollout.get("sync_bucket_mb", 256)) * 2**20  # the driver holds two at most
        res = rollout.get("worker_resources", {}) or {}
        self.resources = {"num_cpus": float(res.get("cpus", 1.0)), "num_gpus": float(res.get("gpus", 0.0))}
        scorers = int(rollout.get("scoring_workers", 1)) if self.readiness_on == "scoring_workers" else 0
        self._owns_cluster = connect(str(rollout.get("ray_address", "")), (self.n + scorers) * self.resources["num_cpus"])
        self._closed = False
        bundle = {k: v for k, v in (("CPU", self.resources["num_cpus"]), ("GPU", self.resources["num_gpus"])) if v > 0}
        check_placeable(bundle, self.n + scorers, ray.cluster_resources())
        self.group = placement_group([dict(bundle) for _ in range(self.n + scorers)], strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=self.timeout)
        except GetTimeoutError:
            remove_placement_group(self.group)
            raise UserError(f"Ray could not place {self.n + scorers} rollout workers of {bundle} within "
                            f"rollout.request_timeout_s = {self.timeout:g} s (free now: {free_resources()}); lower "
                            "rollout.workers or rollout.worker_resources, or free the cluster") from None
        self.actors = [self._spawn(i) for i in range(self.n + scorers)]
        ray.get([a.pid.remote() for a in self.actors], timeout=self.build_timeout)  # built (model loaded) before step 1
        refusals = [r for r in ray.get([a.refusal.remote() for a in self.actors]) if r]
        if refusals:
            self.close()
            raise UserError(f"{refusals[0]}; every node with rollout workers must see the run's files at the "
                            "driver's paths (the run folder's initial/, the data files): put them on a shared "
                            "filesystem mounted at the same path on every node")
        self.restarts = [0] * (self.n + scorers)
        self._source: Any = None  # the last weights given to sync_weights: a replacement is streamed them
        self._kept: list[Any] | None = None  # a one-pass source's buckets as sent (object refs): a replacement's
        self._eval_state: dict[str, int] | None = None  # worker 0's evaluation counter: a replacement loads it
        self.trees: dict[str, RolloutTree] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.branches: dict[str, dict[int, int]] = {}
        self.owner: dict[str, int] = {}  # task id -> the worker holding its trees (while any lives)
        self.prefilled: dict[str, int] = {}  # task id -> the worker that prefilled its prompt this step
        self.work: dict[str, float] = {}  # tree id -> rollouts requested of it
        self.load = [0.0] * self.n  # planned rollouts of the live trees, per worker
        self._step_work = [0.0] * self.n  # rollouts requested this step, per worker (worker_imbalance)
        self._metrics: dict[str, float] = {}
        self._group: Any = None  # nccl: the weight-sync process group (its own, not the default group)
        if self.weight_sync == "nccl":
            self._store = sync_store(ray.util.get_node_ip_address(), 0, self.timeout, serve=True)
            self.generation = 0
            self._join_group()

    # --- the protocol ----------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [f"w{i}" for i in range(len(self.actors))]

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]:
        return self._by_task("prompt_ids", tasks)

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]:
        """On each task's owner (unplaced tasks in turn); the worker keeps the prefill's KV, and the
        task's placement prefers it on a tie."""
        return self._by_task("prompt_states", tasks, remember=True)

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult:
        new: dict[str, float] = {}
        for r in requests:
            self.tasks[r.tree_id] = r.task
            if r.task["id"] not in self.owner:
                new[r.task["id"]] = new.get(r.task["id"], 0.0) + r.n
        self.owner.update(place(list(new.items()), self.load, self.prefilled))
        for r in requests:
            self._plan(r.tree_id, r.n)
        shares = self._shares(requests, lambda r: self.owner[r.task["id"]])
        result = self._rollout_call("start", requests, shares)
        for r in requests:
            self.branches[r.tree_id] = {0: int(r.n)}
        return result

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult:
        unknown = [r.tree_id for r in requests if r.tree_id not in self.tasks]
        if unknown:
            raise ValueError(f"expand of trees {unknown} that no start of this executor produced")
        for r in requests:
            self._plan(r.tree_id, r.k)
        shares = self._shares(requests, lambda r: self._owner_of(r.tree_id))
        result = self._rollout_call("expand", requests, shares)
        for r in requests:
            counts = self.branches[r.tree_id]
            first = counts.get(r.node_id, 0) if r.first_branch is None else r.first_branch
            counts[r.node_id] = max(counts.get(r.node_id, 0), first + r.k)
        return result

    def adopt(self, requests: Sequence[AdoptRequest]) -> None:
        """Trees from elsewhere: their owners take them over (and this driver's copy is theirs)."""
        new: dict[str, float] = {}
        for req in requests:
            self.trees.pop(req.tree.tree_id, None)
            apply_delta(self.trees, req.tree)
            self.tasks[req.tree.tree_id] = req.task
            self.branches[req.tree.tree_id] = {int(k): v for k, v in req.branches.items()}
            if req.task["id"] not in self.owner:
                new[req.task["id"]] = new.get(req.task["id"], 0.0) + max(1, len(req.tree.trajectories))
        self.owner.update(place(list(new.items()), self.load, self.prefilled))
        for req in requests:
            self._plan(req.tree.tree_id, max(1, len(req.tree.trajectories)))
        shares = self._shares(requests, lambda r: self._owner_of(r.tree.tree_id))
        self._fan_out("adopt", shares)

    def score(self, requests: Sequence[ScoreRequest]) -> ScoreResult:
        """Readiness where ``rollout.readiness_on`` says: the driver, the trees' owners or the scoring actors."""
        if not requests:
            return ScoreResult()
        if self.readiness_on == "driver":
            if self.driver_score is None:
                raise ValueError("rollout.readiness_on = 'driver' but the driver has no reference scorer "
                                 "(readiness needs algo.credit = true)")
            return self.driver_score(requests)
        if self.readiness_on == "workers":  # where the trees are (unplaced tasks in turn)
            shares = {}
            for i, r in enumerate(requests):
                shares.setdefault(self.owner.get(r.task_id, i % self.n), []).append(r)
        else:
            scorers = list(range(self.n, len(self.actors)))
            shares = {}
            for i, r in enumerate(requests):  # round robin over the scoring actors
                shares.setdefault(scorers[i % len(scorers)], []).append(r)
        merged = ScoreResult()
        for part in self._fan_out("score", shares).values():
            for tree, nodes in part.nodes.items():
                merged.nodes.setdefault(tree, {}).update(nodes)
            for tree, leaves in part.trajectories.items():
                merged.trajectories.setdefault(tree, {}).update(leaves)
        return merged

    def sync_weights(self, weights: Any, version: int) -> None:
        """Every worker takes ``weights`` (the trainer's model, or buckets) as ``version``, streamed
        bucket by bucket in the policy's dtype; a worker that died since the last call (idle during
        the update) is replaced here, like a worker that fails a request."""
        clock = time.perf_counter()
        if self.weight_sync == "nccl":  # a broadcast waits for every member: replace the dead first
            for w, err in self._dead().items():
                self._replace(w, err)
        self._source, self.version = weights, int(version)  # what a replacement is streamed
        # A one-pass source (the shards of a driver without a whole copy: distributed/streamed.py) cannot
        # be read again for a replacement: the buckets sent stay in the object store until the next sync.
        self._kept = [] if getattr(weights, "stream_once", False) else None
        sent, failed = self._stream(list(range(len(self.actors))), self.weight_sync, record=self._kept)
        for w, err in failed.items():  # a worker that died while idle fails here: replace it
            if self.weight_sync == "nccl":
                raise WorkerLostError(f"rollout worker w{w} failed during a weight broadcast, which the other "
                                      f"members cannot finish without it (last error: {_one_line(err)})") from None
            self._replace(w, err)  # the replacement takes these weights and re-adopts its trees
        self._add("time_sync_weights", time.perf_counter() - clock)
        self._add("sync_bytes", float(sent))

    def _buckets(self, replay: bool = False) -> Iterator[list[tuple[str, Any]]]:
        """The last weights as buckets in the policy's dtype, built one at a time (``replay``: a
        one-pass source's buckets again, from the object store)."""
        from tracerl.models.weights import weight_buckets  # torch only: no model code

        if replay:
            for ref in self._kept or []:
                yield ray.get(ref, timeout=self.timeout)[0]
        elif self._kept is not None:  # one pass, gathered as it goes
            yield from self._source.buckets(self.bucket_bytes, self.sync_dtype)
        elif isinstance(self._source, list):  # buckets given: cast each
            for bucket in self._source:
                yield [(n, t.to(self.sync_dtype) if t.is_floating_point() else t) for n, t in bucket]
        else:
            yield from weight_buckets(self._source, self.bucket_bytes, self.sync_dtype)

    def _stream(self, workers: Sequence[int], mode: str,
                record: list[Any] | None = None) -> tuple[int, dict[int, BaseException]]:
        """Stream the last weights to ``workers`` by ``mode`` (``nccl``: all of them, the group's
        members): bytes sent (once per bucket) and the workers that failed (dead or silent past the
        timeout), which get nothing more. ``record``: where a one-pass source's buckets are kept."""
        failed: dict[int, BaseException] = {}
        window: deque[tuple[Any, dict[int, Any]]] = deque()  # (bucket, calls) in flight: two at most
        sent = 0
        for bucket in self._buckets(replay=record is None and self._kept is not None):
            payload = ray.put(pack([bucket], mode))  # one copy in this node's object store
            if record is not None:  # a replacement's copy: the same object unless it holds no tensors
                record.append(payload if mode == "object_store" else ray.put(pack([bucket], "object_store")))
            keep = bucket if mode == "cuda_ipc" else None  # handles: the tensors must outlive the loads
            window.append((keep, {w: self.actors[w].load.remote(payload, mode) for w in workers if w not in failed}))
            if mode == "nccl":
                broadcast([bucket], self._group)
            sent += bucket_bytes([bucket])
            del bucket, keep, payload  # object_store: the object store's copy is all that stays
            if len(window) > 1:
                self._wait(window.popleft()[1], failed)
        while window:
            self._wait(window.popleft()[1], failed)
        self._wait({w: self.actors[w].end_sync.remote(self.version) for w in workers if w not in failed}, failed)
        return sent, failed

    def _wait(self, calls: Mapping[int, Any], failed: dict[int, BaseException]) -> None:
        deadline = time.monotonic() + self.timeout
        for w, ref in calls.items():
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except _FAULTS as err:
                failed.setdefault(w, err)

    def forget(self, tree_ids: Sequence[str]) -> None:
        shares = self._shares([t for t in tree_ids if t in self.tasks], self._owner_of)
        self._fan_out("forget", shares, retry=False)
        for t in tree_ids:
            task = self.tasks.get(t)
            if task is not None:
                self.load[self.owner[task["id"]]] -= self.work.pop(t, 0.0)
            self.trees.pop(t, None)
            self.tasks.pop(t, None)
            self.branches.pop(t, None)
        live = {task["id"] for task in self.tasks.values()}
        self.owner = {task: w for task, w in self.owner.items() if task in live}  # freed tasks place anew
        if not self.tasks:  # the step's trees are gone: its prefills too
            self.prefilled.clear()

    def evaluate(self, tasks: Sequence[Any], samples: int = 1, seed: int = 0) -> dict[str, float]:
        """On worker 0 (one engine: the same numbers as a local executor). Its evaluation counter is
        kept here too, so a replacement of worker 0 continues it."""
        out = self._fan_out("evaluate", {0: [list(tasks), samples, seed]}, unpack_args=True)[0]
        self._eval_state = self._fan_out("eval_state", {0: []}, unpack_args=True)[0]
        return out

    def eval_state(self) -> dict[str, int]:
        """Worker 0's (it runs every evaluation)."""
        return self._fan_out("eval_state", {0: []}, unpack_args=True)[0]

    def load_eval_state(self, state: Mapping[str, int]) -> None:
        self._eval_state = dict(state)
        self._fan_out("load_eval_state", {0: [dict(state)]}, unpack_args=True)

    def clear_prefix_cache(self) -> None:
        self._fan_out("clear_prefix_cache", {i: [] for i in range(len(self.actors))}, unpack_args=True)

    def sleep(self, level: int = 1) -> None:
        self._fan_out("sleep", {i: [level] for i in range(self.n)}, unpack_args=True)

    def wake_up(self) -> None:
        self._fan_out("wake_up", {i: [] for i in range(self.n)}, unpack_args=True)

    def take_metrics(self) -> dict[str, float]:
        """This step's counters and timings (then reset): ``time_sync_weights``, ``sync_bytes``,
        ``worker_failures``, ``requests_retried``, ``worker_<name>_tokens_per_s``."""
        out = {"worker_failures": 0.0, "requests_retried": 0.0, "time_sync_weights": 0.0, "sync_bytes": 0.0,
               "worker_imbalance": imbalance(self._step_work)}
        self._step_work = [0.0] * self.n
        out.update(self._metrics)
        out["sync_s_per_gb"] = out["time_sync_weights"] / (out["sync_bytes"] / 1e9) if out["sync_bytes"] else 0.0
        for name in self.names[: self.n]:
            tokens, seconds = out.pop(f"_tokens_{name}", 0.0), out.pop(f"_seconds_{name}", 0.0)
            out[f"worker_{name}_tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
        self._metrics = {}
        return out

    def close(self) -> None:
        """Kill the workers and free their placement group; shut down the local cluster this
        executor started, and leave one it joined (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._group = self._store = None  # nccl: the weight-sync group and its store go with the workers
        for actor in self.actors:
            ray.kill(actor)
        remove_placement_group(self.group)
        if self._owns_cluster:
            ray.shutdown()

    # --- fan-out and faults ------------------------------------------------------------------

    def _spawn(self, index: int) -> Any:
        """A fresh actor in bundle ``index``, at the current version (a replacement then loads the
        last weights, when there were any since the initial policy)."""
        global _ACTOR
        if _ACTOR is None:
            _ACTOR = ray.remote(RolloutWorker)
        actor = _ACTOR.options(
            max_restarts=0, max_task_retries=0, **self.resources,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index))
        return actor.remote(replace(self.spec, worker=f"w{index}", version=self.version), self.weight_sync)

    def _owner_of(self, tree_id: str) -> int:
        return self.owner[self.tasks[tree_id]["id"]]

    def _plan(self, tree_id: str, rollouts: float) -> None:
        """Count ``rollouts`` requested of ``tree_id`` on its owner's load."""
        w = self._owner_of(tree_id)
        self.work[tree_id] = self.work.get(tree_id, 0.0) + rollouts
        self.load[w] += rollouts
        self._step_work[w] += rollouts

    def _by_task(self, method: str, tasks: Sequence[dict[str, Any]], *, remember: bool = False) -> list[Any]:
        """``method`` on each task's owner; unplaced tasks in turn (``remember``: as where they were prefilled)."""
        where = [self.owner.get(t["id"], i % self.n) for i, t in enumerate(tasks)]
        if remember:
            self.prefilled.update({t["id"]: w for t, w in zip(tasks, where, strict=True) if t["id"] not in self.owner})
        shares = self._shares(list(range(len(tasks))), lambda i: where[i])
        answers = self._fan_out(method, {w: [tasks[i] for i in idx] for w, idx in shares.items()})
        return in_request_order(shares, answers, len(tasks))

    @staticmethod
    def _shares(items: Sequence[Any], key: Callable[[Any], int]) -> dict[int, list[Any]]:
        """``items`` by worker, each worker's in their original order."""
        out: dict[int, list[Any]] = {}
        for item in items:
            out.setdefault(key(item), []).append(item)
        return out

    def _rollout_call(self, method: str, requests: Sequence[Any], shares: dict[int, list[Any]]) -> RolloutResult:
        """``start``/``expand`` fanned out; one merged result, deltas in request order, applied to the copies."""
        clock = time.perf_counter()
        parts = self._fan_out(method, shares)
        by_tree = {d.tree_id: d for part in parts.values() for d in part.deltas}
        deltas = [by_tree[t] for t in dict.fromkeys(r.tree_id for r in requests) if t in by_tree]
        for delta in deltas:
            if delta.prompt_ids is not None:
                self.trees.pop(delta.tree_id, None)
            apply_delta(self.trees, delta)
        for part in parts.values():
            self._add(f"_tokens_{part.worker}", float(part.generated_tokens))
            self._add(f"_seconds_{part.worker}", part.seconds)
            current_progress().finished_elsewhere(part.rollouts, part.generated_tokens)  # the step's status line
        return RolloutResult(deltas, sum(p.rollouts for p in parts.values()),
                             sum(p.generated_tokens for p in parts.values()), version=self.version, worker="ray",
                             seconds=time.perf_counter() - clock,
                             tool_stats=_merge_tool_stats([p.tool_stats for p in parts.values()]),
                             backend_stats=_sum_counts([p.backend_stats for p in parts.values()]))

    def _fan_out(self, method: str, shares: dict[int, list[Any]], *, retry: bool = True,
                 unpack_args: bool = False) -> dict[int, Any]:
        """``method`` on each worker with its share, in parallel; a failed worker is replaced and
        its share sent again (``retry``), until it answers or its restarts are spent."""
        def submit(w: int) -> Any:
            args = shares[w] if unpack_args else [shares[w]]
            return self.actors[w].call.remote(method, *args)

        pending = {w: (submit(w), time.monotonic()) for w in shares}
        out: dict[int, Any] = {}
        while pending:
            w, (ref, since) = next(iter(pending.items()))
            try:
                out[w] = ray.get(ref, timeout=max(0.0, since + self.timeout - time.monotonic()))
            except _FAULTS as err:
                self._replace(w, err)
                if not retry:
                    del pending[w]
                    continue
                self._add("requests_retried", float(len(shares[w]) if not unpack_args else 1))
                pending[w] = (submit(w), time.monotonic())
                continue
            del pending[w]
        return out

    def _replace(self, w: int, err: BaseException) -> None:
        """Worker ``w`` failed: a fresh actor in its bundle with the last weights and its trees."""
        self._add("worker_failures", 1.0)
        owned = sorted(t for t, task in self.tasks.items() if self.owner.get(task["id"]) == w)
        while True:
            self.restarts[w] += 1
            if self.restarts[w] > self.max_restarts:
                raise WorkerLostError(
                    f"rollout worker w{w} failed {self.restarts[w]} times (rollout.max_worker_restarts = "
                    f"{self.max_restarts}); its trees: {', '.join(owned) or 'none'}; last error: {_one_line(err)}")
            ray.kill(self.actors[w], no_restart=True)  # a silent worker must not answer late
            self.actors[w] = self._spawn(w)
            try:
                ray.get(self.actors[w].pid.remote(), timeout=self.build_timeout)
                if self._source is not None:  # the last weights (nccl, one-pass: through the object store)
                    alone = self.weight_sync == "nccl" or self._kept is not None
                    _, failed = self._stream([w], "object_store" if alone else self.weight_sync)
                    if failed:
                        raise failed[w]
                if self.weight_sync == "nccl":  # a new generation of the group, the replacement in it
                    self._join_group()
                adopt = [self._adopt_request(t) for t in owned if t in self.trees]
                if adopt:
                    ray.get(self.actors[w].call.remote("adopt", adopt), timeout=self.build_timeout)
                if w == 0 and self._eval_state is not None:  # evaluation seeds continue where they were
                    ray.get(self.actors[0].call.remote("load_eval_state", self._eval_state), timeout=self.build_timeout)
                return
            except _FAULTS as again:
                self._add("worker_failures", 1.0)
                err = again

    def _adopt_request(self, tree_id: str) -> AdoptRequest:
        branches = {str(k): v for k, v in sorted(self.branches.get(tree_id, {}).items())}
        return AdoptRequest(self.tasks[tree_id], tree_delta(self.trees[tree_id]), branches)

    def _join_group(self) -> None:
        """Every worker and this driver join a new generation of the weight-sync group (at start,
        and after a replacement: a new process cannot join a group already made)."""
        self.generation += 1
        backend = "nccl" if str(self.spec.config["model"].get("device", "cpu")).startswith("cuda") else "gloo"
        host, port, world = ray.util.get_node_ip_address(), self._store.port, len(self.actors) + 1
        pending = [a.join_group.remote(host, port, self.generation, world, i + 1, backend, self.timeout)
                   for i, a in enumerate(self.actors)]
        self._group = None
        self._group = sync_group(self._store, backend, self.generation, 0, world, self.timeout)
        ray.get(pending, timeout=self.timeout)

    def _dead(self) -> dict[int, BaseException]:
        """Workers that do not answer a ping (died while idle), with the error."""
        out: dict[int, BaseException] = {}
        refs = [a.pid.remote() for a in self.actors]
        deadline = time.monotonic() + self.timeout
        for w, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except _FAULTS as err:
                out[w] = err
        return out

    def _add(self, key: str, value: float) -> None:
        self._metrics[key] = self._metrics.get(key, 0.0) + value


def _merge_tool_stats(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``dataclasses.asdict(ToolStats)`` records of several workers as one: numbers summed, dicts
    merged key by key (per-tool ``[calls, failures]`` pairs summed), the latest non-empty text kept."""
    out: dict[str, Any] = {}
    for record in records:
        out = _merge(out, record)
    return out


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: _merge(a[k], v) if k in a else v for k, v in b.items()}}
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [_merge(x, y) for x, y in zip(a, b, strict=True)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a + b
    return b if b or b == 0 else a


def _sum_counts(records: Sequence[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in records:
        for key, value in record.items():
            out[key] = out.get(key, 0) + int(value)
    return out


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"
