"""TRACE's tree expansion on agent-loop workers: Ray actors started by
:class:`~.manager.TraceAgentLoopManager` as verl 0.9.1 starts its ``AgentLoopWorker``\\ s
(``actor_rollout_ref.rollout.agent.num_workers`` of them, named ``tracerl_tree_worker_{i}_{hex}``,
round robin over the nodes with CPUs, soft node affinity: ``AgentLoopManager._init_agent_loop_workers``).

The planner (scheme, predictor, budget, the planner's generator) stays on the driver; a worker
holds the environment and a :class:`~tracerl.rollout.engine.RolloutEngine` over a
:class:`~.server_policy.VerlServerPolicy` on verl's ``LLMServerClient`` (the handle verl gives the
manager, passed to each actor), and runs start / expand requests with tracerl's independent turn
scheduling: every episode's next turn goes to the servers as soon as its observation is ready.

Why not a subclass of verl's ``AgentLoopWorker``: its one call is ``generate_sequences(batch)``,
a prompt batch in and padded finished samples out, one agent loop per sample; a TRACE step needs
a tree to stay on its worker between calls (``expand`` from a node of a tree started earlier, the
episode clones kept there) and the driver's planner between the calls. So the worker is
tracerl's executor pattern (:mod:`tracerl.rollout.ray_worker`: a
:class:`~tracerl.rollout.executor.LocalExecutor` inside an actor) and the driver's side,
:class:`WorkerExecutor`, is the executor protocol the scheme code already calls
(:mod:`tracerl.rollout.executor`): ``start`` and ``expand`` fan out to the trees' owners at once,
so all trees of a stage are in flight across the workers together. A task's trees stay on one
worker (:func:`~tracerl.rollout.placement.place`, least planned rollouts first); readiness is
scored where the driver's scorer is. The driver imports no environment or model code for this:
workers build theirs from ``build`` (an import path, ``module:function(config) ->``
:class:`ExpansionParts`; a verl run's: :func:`expansion_parts`).

Faults: a failed or timed-out *request* fails its tree only (the worker's policy records it;
:meth:`WorkerExecutor.take_failed` collects them). A worker process that dies fails the step (as
one of verl's own agent-loop workers would); verl does not restart those either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import uuid4

import ray

from tracerl.core.protocol import ExpandRequest, RolloutResult, ScoreRequest, ScoreResult, StartRequest
from tracerl.core.registry import resolve_import_path
from tracerl.rollout.placement import imbalance, in_request_order, place
from tracerl.rollout.ray_executor import RayExecutor, _merge_tool_stats, _sum_counts

ScoreFn = Callable[[Sequence[ScoreRequest]], ScoreResult]


@dataclass
class ExpansionParts:
    """What a worker expands trees with (its own copies: the driver holds none of these)."""

    tokenizer: Any
    fmt: Any
    environment: Any
    verifier: Any
    engine: Any
    """tracerl's :class:`~tracerl.rollout.engine.EngineConfig` of training rollouts."""


def expansion_parts(config: Any) -> ExpansionParts:
    """A worker's parts from verl's ``config``: the ``tracerl`` section resolved as
    :func:`~.manager.build_parts` resolves it, verl's tokenizer, the format, ``data.environment``
    over the run's documents, the verifier and the engine settings."""
    from tracerl.agent.formats import get_format
    from tracerl.envs.verifiers import get_verifier
    from tracerl.integrations.verl.settings import tracerl_config
    from tracerl.integrations.verl.settings import verl_tokenizer
    from tracerl.train.data import load_task_data, run_environment

    cfg = tracerl_config(config)
    tokenizer = verl_tokenizer(config)
    fmt = get_format(cfg.model.format, tokenizer=tokenizer, system=cfg.model.system_prompt, tool_list=cfg.model.tool_list)
    documents = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).documents
    environment = run_environment(documents, cfg.data, cfg.rollout.engine)
    return ExpansionParts(tokenizer, fmt, environment, get_verifier(cfg.data.verifier), cfg.rollout.engine)


class TreeWorker:
    """The actor: a training and a validation :class:`LocalExecutor` over one server policy."""

    def __init__(self, build: str | Callable[[Any], ExpansionParts], config: Any, llm_client: Any, name: str,
                 timeout_s: float | None) -> None:
        from tracerl.integrations.verl.server_policy import VerlServerPolicy
        from tracerl.integrations.verl.settings import check_sampling
        from tracerl.rollout.engine import RolloutEngine
        from tracerl.rollout.executor import LocalExecutor

        make = resolve_import_path(build, "tree worker builder") if isinstance(build, str) else build
        p = cast(Callable[[Any], ExpansionParts], make)(config)
        self.policy = VerlServerPolicy(llm_client, p.tokenizer, timeout_s=timeout_s)
        val = check_sampling(config, p.engine)
        self.executors = {
            "train": LocalExecutor(RolloutEngine(self.policy, p.environment, p.fmt, p.verifier, p.engine), worker=name),
            "val": LocalExecutor(RolloutEngine(self.policy, p.environment, p.fmt, p.verifier, val), worker=name),
        }

    def call(self, which: str, method: str, *args: Any) -> Any:
        return getattr(self.executors[which], method)(*args)

    def take_failed(self) -> dict[str, str]:
        return self.policy.take_failed()

    def ready(self) -> bool:
        return True


@dataclass
class _Counters:
    """What a :class:`WorkerExecutor` and its :meth:`~WorkerExecutor.view` count together."""

    stats: dict[str, int] = field(default_factory=dict)
    """The servers' counters, summed over every call's results."""
    tokens: list[float] = field(default_factory=list)
    """Tokens generated per worker since the last :meth:`~WorkerExecutor.take_metrics`."""


class WorkerExecutor:
    """The executor protocol over :class:`TreeWorker` actors (module docstring). ``which`` picks
    the workers' training or validation engine; :meth:`view` gives the other over the same actors."""

    def __init__(self, actors: list[Any], score: ScoreFn | None = None, which: str = "train",
                 shared: _Counters | None = None) -> None:
        if not actors:
            raise ValueError("WorkerExecutor needs at least one tree worker")
        self.actors, self.scorer, self.which = actors, score, which
        self.version = 0
        self.shared = shared if shared is not None else _Counters(tokens=[0.0] * len(actors))
        self.owner: dict[str, int] = {}  # task id -> the worker holding its trees (while any lives)
        self.tasks: dict[str, str] = {}  # tree id -> task id
        self.load = [0.0] * len(actors)  # planned rollouts of the live trees, per worker

    @classmethod
    def launch(cls, n: int, build: str | Callable[[Any], ExpansionParts], config: Any, llm_client: Any,
               timeout_s: float | None, score: ScoreFn | None = None) -> WorkerExecutor:
        """``n`` workers placed as verl places its agent-loop workers; returns once all are built."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0]
        actor = ray.remote(TreeWorker)
        actors = [actor.options(name=f"tracerl_tree_worker_{i}_{uuid4().hex[:8]}",
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)],
                                                                                   soft=True))
                  .remote(build, config, llm_client, f"w{i}", timeout_s) for i in range(n)]
        ray.get([a.ready.remote() for a in actors])
        return cls(actors, score)

    def view(self, which: str) -> WorkerExecutor:
        """The same actors, running their ``which`` engine (counters shared)."""
        return WorkerExecutor(self.actors, self.scorer, which, self.shared)

    @property
    def stats(self) -> dict[str, int]:
        """The servers' counters summed over every call's results (``generated_tokens``, ...)."""
        return self.shared.stats

    def take_metrics(self) -> dict[str, float]:
        """Since the last call: ``tree_workers``, ``tree_workers_busy`` (workers that generated
        tokens) and ``tree_worker_imbalance`` (the busiest worker's tokens over the mean)."""
        tokens, self.shared.tokens = self.shared.tokens, [0.0] * len(self.actors)
        return {"tree_workers": float(len(self.actors)), "tree_workers_busy": float(sum(t > 0 for t in tokens)),
                "tree_worker_imbalance": imbalance(tokens)}

    # --- the protocol ----------------------------------------------------------------------

    def prompt_ids(self, tasks: Sequence[dict[str, Any]]) -> list[list[int]]:
        return self._by_task("prompt_ids", tasks)

    def prompt_states(self, tasks: Sequence[dict[str, Any]]) -> list[list[float] | None]:
        return [None] * len(tasks)  # verl's servers return no hidden states

    def start(self, requests: Sequence[StartRequest]) -> RolloutResult:
        new: dict[str, float] = {}
        for r in requests:
            self.tasks[r.tree_id] = r.task["id"]
            if r.task["id"] not in self.owner:
                new[r.task["id"]] = new.get(r.task["id"], 0.0) + r.n
        self.owner.update(place(list(new.items()), self.load))
        for r in requests:
            self.load[self.owner[r.task["id"]]] += r.n
        return self._rollout("start", requests, lambda r: self.owner[r.task["id"]])

    def expand(self, requests: Sequence[ExpandRequest]) -> RolloutResult:
        unknown = [r.tree_id for r in requests if r.tree_id not in self.tasks]
        if unknown:
            raise ValueError(f"expand of trees {unknown} that no start of this executor produced")
        for r in requests:
            self.load[self._owner_of(r.tree_id)] += r.k
        return self._rollout("expand", requests, lambda r: self._owner_of(r.tree_id))

    def adopt(self, requests: Sequence[Any]) -> None:
        raise ValueError("the verl tree workers do not adopt trees (a worker that dies fails the step)")

    def score(self, requests: Sequence[ScoreRequest]) -> ScoreResult:
        if not requests:
            return ScoreResult()
        if self.scorer is None:
            raise ValueError("this executor has no reference scorer (readiness needs algo.credit = true)")
        return self.scorer(requests)

    def sync_weights(self, weights: Any, version: int) -> None:
        """verl moves the weights; the workers' next rows must come from ``version``."""
        ray.get([a.call.remote(self.which, "sync_weights", None, int(version)) for a in self.actors])
        self.version = int(version)

    def forget(self, tree_ids: Sequence[str]) -> None:
        shares: dict[int, list[str]] = {}
        for t in tree_ids:
            if t in self.tasks:
                shares.setdefault(self._owner_of(t), []).append(t)
        self._fan_out("forget", shares)
        for t in tree_ids:
            self.tasks.pop(t, None)
        live = set(self.tasks.values())
        self.owner = {task: w for task, w in self.owner.items() if task in live}
        if not self.tasks:
            self.load = [0.0] * len(self.actors)

    def take_failed(self) -> dict[str, str]:
        """Tree id -> why, of the trees whose requests failed since the last call, on any worker."""
        out: dict[str, str] = {}
        for part in ray.get([a.take_failed.remote() for a in self.actors]):
            out.update(part)
        return out

    def clear_prefix_cache(self) -> None:
        """The servers' caches are verl's: nothing to drop."""

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)

    # --- fan-out ---------------------------------------------------------------------------

    def _owner_of(self, tree_id: str) -> int:
        return self.owner[self.tasks[tree_id]]

    def _fan_out(self, method: str, shares: dict[int, list[Any]]) -> dict[int, Any]:
        refs = {w: self.actors[w].call.remote(self.which, method, items) for w, items in shares.items()}
        return dict(zip(refs, ray.get(list(refs.values())), strict=True))

    def _by_task(self, method: str, tasks: Sequence[dict[str, Any]]) -> list[Any]:
        where = [self.owner.get(t["id"], i % len(self.actors)) for i, t in enumerate(tasks)]
        shares = RayExecutor._shares(list(range(len(tasks))), lambda i: where[i])
        answers = self._fan_out(method, {w: [tasks[i] for i in idx] for w, idx in shares.items()})
        return in_request_order(shares, answers, len(tasks))

    def _rollout(self, method: str, requests: Sequence[Any], owner: Callable[[Any], int]) -> RolloutResult:
        """``method`` on every owner at once; one result, deltas in request order (first touch)."""
        answers = self._fan_out(method, RayExecutor._shares(requests, owner))
        for w, part in answers.items():
            self.shared.tokens[w] += float(part.generated_tokens)
        parts = list(answers.values())
        by_tree = {d.tree_id: d for part in parts for d in part.deltas}
        deltas = [by_tree[t] for t in dict.fromkeys(r.tree_id for r in requests) if t in by_tree]
        backend = _sum_counts([p.backend_stats for p in parts])
        self.shared.stats = _sum_counts([self.shared.stats, backend])
        return RolloutResult(deltas, sum(p.rollouts for p in parts), sum(p.generated_tokens for p in parts),
                             version=self.version, worker="verl_workers", seconds=max((p.seconds for p in parts),
                                                                                       default=0.0),
                             tool_stats=_merge_tool_stats([p.tool_stats for p in parts]), backend_stats=backend)
