"""``TraceAgentLoopManager``: TRACE as verl 0.9.1's rollout driver
(``actor_rollout_ref.rollout.agent.agent_loop_manager_class``).

verl's v1 trainer registers each prompt of a batch in TransferQueue (key = its ``uid``, tag
``is_prompt``/``pending``), calls ``generate_sequences(batch)`` and then waits in its replay
buffer until every prompt's tag says ``finished``; it trains on the samples whose keys start with
``{uid}_``. This manager, in the trainer's process:

1. reads the tasks from the batch (:func:`task_from_row`: question, gold answers; task ids from
   the data, :func:`stable_ids`, so every run and every resume samples the same rows);
2. plans with tracerl's TRACE scheme and success predictor (a :class:`RolloutSession`), spending
   exactly ``rollout.budget`` rollouts: the step's sample count. The trees are expanded on
   ``actor_rollout_ref.rollout.agent.num_workers`` tree workers (Ray actors, :mod:`.workers`: the
   environment and a rollout engine each, requests to verl's ``LLMServerClient`` through
   :class:`VerlServerPolicy` with independent turn scheduling: request id = tree id, per-row seeds
   and ``max_tokens``, stop strings, log-probs, weights step checked); ``+tracerl.expansion=driver``
   expands them in this process instead (a :class:`LocalExecutor`, the same trees); a failed or
   timed-out request fails its tree only (written as zero, counted in ``failed_trees``), and
   ``max_failed_steps`` steps in a row with at least half the trees failed stop the run;
3. scores readiness with the frozen HF reference in this process (``ReferenceScorer``: the
   initial policy), when TRACE credit is on;
4. writes every leaf to TransferQueue with its own reward (:func:`~.leaves.leaf_samples`), marks
   every prompt of the batch ``finished`` (a prompt the planner did not pick has no samples) and
   updates the predictor on the step's trees.

verl's reward step does not touch these rewards: verl scores a sample in its agent loop workers
(not started here) or, with a colocated reward model (``reward.reward_model.enable=True`` without
its own resource pool), in the trainer over ``rm_scores``; this manager refuses that setting, so
``rm_scores`` stay the verifier's and the estimators read ``tracerl_reward`` anyway.

Validation batches (``validate``) run ``val_kwargs.n`` chains per prompt at ``val_kwargs.temperature``.
The predictor's state is saved beside verl's checkpoint (:meth:`TraceAgentLoopManager.save_state`,
called by the ``tracerl_sync`` trainer).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tracerl.allocation.session import RolloutSession
from tracerl.core.seeds import derive_seed
from tracerl.core.types import RolloutTree, Task
from tracerl.errors import UserError
from tracerl.integrations.verl.check import check_registrations
from tracerl.integrations.verl.leaves import leaf_samples, mark_failed
from tracerl.integrations.verl.predictor_io import PREDICTOR_FILE as PREDICTOR_FILE  # in global_step_{n}/
from tracerl.integrations.verl.predictor_io import load_predictor_state, save_predictor_state
from tracerl.integrations.verl.readiness_modes import connect_reference, readiness_scorer
from tracerl.integrations.verl.server_policy import VerlServerPolicy
from tracerl.integrations.verl.settings import READINESS as READINESS  # re-exported: callers import them here
from tracerl.integrations.verl.settings import SERVERS as SERVERS
from tracerl.integrations.verl.settings import check_model_path, check_optim, check_sampling, check_verl_config
from tracerl.integrations.verl.settings import failure_settings, reference_model, tracerl_config, verl_tokenizer
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.executor import LocalExecutor


@dataclass
class TraceParts:
    """What the manager plans and executes with (built by :func:`build_parts` from ``config.tracerl``)."""

    tokenizer: Any
    fmt: Any
    environment: Any
    verifier: Any
    engine: EngineConfig
    scheme: Any
    """tracerl's rollout scheme (``trace``: its ``collect(session, pool, budget)``)."""
    budget: int
    """Rollouts (= leaves = verl samples) per step."""
    predictor: Any = None
    reference: Any = None
    """The frozen ``ReferenceScorer`` (readiness); None without TRACE credit."""
    seed: int = 0
    verl_reference: Any = None
    """The batch scorer the reference scores through, whose counters the step logs
    (:func:`~.readiness.readiness_scorer`): tracerl's forward (``in_process``), verl's reference
    worker (``reference_worker``: the ``tracerl_sync`` trainer connects it) or the frozen-reference
    servers (``reference_server``: connected to verl's ``teacher_client`` here)."""
    expansion: Any = None
    """What tree workers build their parts with (:mod:`.workers`: an import path or a function of
    verl's config); None: the trees are expanded in this process over ``environment``."""


def _gold(reward_model: Any) -> tuple[str, ...]:
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else reward_model
    if isinstance(truth, Mapping):  # Search-R1: {"target": [aliases]}
        truth = truth.get("target")
    if isinstance(truth, str):
        truth = [truth]
    return tuple(str(a) for a in list(truth if truth is not None else []))


def task_from_row(row: Mapping[str, Any], task_id: str | None = None) -> Task:
    """A batch row as a tracerl task: id = ``task_id`` (default: verl's ``uid``); question =
    ``extra_info.question`` or the last user message of ``raw_prompt`` (tracerl's format renders the
    prompt itself); answers = ``reward_model.ground_truth`` (a string, a list, or Search-R1's
    ``{"target": [...]}``)."""
    uid = str(row["uid"])
    extra = row.get("extra_info") or {}
    question = extra.get("question") if isinstance(extra, Mapping) else None
    if not question:
        users = [m for m in list(row.get("raw_prompt") or []) if isinstance(m, Mapping) and m.get("role") == "user"]
        question = users[-1].get("content") if users else None
    if not question:
        raise UserError(f"prompt {uid}: no question (need extra_info.question or a user message in raw_prompt)")
    answers = _gold(row.get("reward_model"))
    if not answers:
        raise UserError(f"prompt {uid}: reward_model.ground_truth holds no gold answer")
    return Task(id=uid if task_id is None else task_id, question=str(question), answers=answers)


def stable_ids(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Task ids that are the same in every run: ``{data_source}-{extra_info.index}`` (else a hash of
    the prompt), ``.k`` added to a repeat within the batch. verl's ``uid`` is a fresh ``uuid4`` per
    row, and tracerl derives every row's sampling seed from the tree's task id, so ids from uids
    would make two runs (or a run and its resume) sample differently."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for row in rows:
        extra = row.get("extra_info") or {}
        index = extra.get("index") if isinstance(extra, Mapping) else None
        if index is not None:
            base = f"{row.get('data_source', 'data')}-{index}"
        else:
            text = json.dumps(row.get("raw_prompt") or row.get("prompt"), sort_keys=True, default=str)
            base = hashlib.sha1(text.encode()).hexdigest()[:16]
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.append(base if k == 0 else f"{base}.{k}")
    return out


def batch_rows(batch: Any) -> list[dict[str, Any]]:
    """The rows of verl's prompt ``TensorDict`` as plain dicts (as verl's own agent loop worker reads them)."""
    rows: list[dict[str, Any]] = [{} for _ in range(len(batch))]
    for key, value in batch.items():
        for i, row in enumerate(rows):
            if isinstance(value, torch.Tensor):
                row[key] = value[i]
            elif isinstance(value, NonTensorStack):
                row[key] = value[i].data
            elif isinstance(value, NonTensorData):
                row[key] = value.data
            else:
                raise UserError(f"verl batch field {key!r}: unsupported type {type(value).__name__}")
    return rows


class TraceAgentLoopManager:
    """verl's agent loop manager driven by TRACE (module docstring). verl builds it with
    :meth:`create` (``config``, ``llm_client``, ``teacher_client``, ``reward_loop_worker_handles``);
    ``parts`` (tests, custom setups) replaces :func:`build_parts`."""

    def __init__(self, config: Any, llm_client: Any, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None, *, parts: TraceParts | None = None) -> None:
        check_registrations()
        check_verl_config(config)
        self.config = config
        self.llm_client = llm_client
        self.parts = parts if parts is not None else build_parts(config)
        self.verl_reference = self.parts.verl_reference
        connect_reference(self.verl_reference, teacher_client)  # reference_server: verl's teacher_client
        timeout, self.max_failed_steps = failure_settings(config.get("tracerl", None))
        self.failed_steps = 0
        """Consecutive training steps in which at least half the trees failed (:meth:`_failures`)."""
        self.last_failed: dict[str, str] = {}
        p = self.parts
        score = p.reference.score_nodes if p.reference is not None else None
        val_engine = check_sampling(config, p.engine)
        workers = int(config.actor_rollout_ref.rollout.get("agent", {}).get("num_workers", 8))
        self.executor: Any
        self.val_executor: Any
        self.policy: Any = None
        if p.expansion is not None and workers > 0:
            from tracerl.integrations.verl.workers import WorkerExecutor  # imports Ray: only where used

            self.executor = WorkerExecutor.launch(workers, p.expansion, config, llm_client, timeout, score)
            self.val_executor = self.executor.view("val")
            self.counters: Any = self.executor  # the servers' counters (stats) and failed trees (take_failed)
        else:
            self.policy = self.counters = VerlServerPolicy(llm_client, self.parts.tokenizer, timeout_s=timeout)
            self.executor = LocalExecutor(RolloutEngine(self.policy, p.environment, p.fmt, p.verifier, p.engine), score)
            self.val_executor = LocalExecutor(RolloutEngine(self.policy, p.environment, p.fmt, p.verifier, val_engine))
        self.val_n = int((config.actor_rollout_ref.rollout.get("val_kwargs", {}) or {}).get("n", 1))
        self.last_trees: list[RolloutTree] = []
        self.last_tasks: list[Task] = []
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> TraceAgentLoopManager:
        return cls(*args, **kwargs)

    # --- verl's call ---------------------------------------------------------------------

    def generate_sequences(self, prompts: Any) -> None:
        """Roll the batch out with TRACE and put every leaf into TransferQueue (module docstring)."""
        rows = batch_rows(prompts)
        validate = bool(rows[0].pop("validate", False)) if rows else False
        for row in rows[1:]:
            row.pop("validate", None)
        partition = "val" if validate else "train"
        uids = [str(r["uid"]) for r in rows]
        clock = time.perf_counter()
        for uid in uids:
            tq.kv_put(key=uid, partition_id=partition, tag={"status": "running"})
        queue_seconds = time.perf_counter() - clock
        try:
            global_steps = int(rows[0]["global_steps"])
            # sync trainer: step g samples with the weights of step g - 1; validation after step g with g's
            version = global_steps if validate else global_steps - 1
            tasks = [task_from_row(r, i) for r, i in zip(rows, stable_ids(rows), strict=True)]
            self.last_tasks = tasks
            trees = self.validate(tasks, global_steps, version) if validate else self.step(tasks, global_steps, version)
            clock = time.perf_counter()
            keys, fields, tags = leaf_samples(trees, {t.id: u for t, u in zip(tasks, uids, strict=True)},
                                              dict(zip(uids, rows, strict=True)), global_steps, version,
                                              session_per_leaf=validate, failed=self.last_failed)
            if keys:
                tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
        except BaseException:
            for uid in uids:
                tq.kv_put(key=uid, partition_id=partition, tag={"status": "failure"})
            raise
        for uid in uids:
            tq.kv_put(key=uid, partition_id=partition, tag={"status": "finished"})
        if not validate:  # the batch's TransferQueue writes (status tags, leaves): outside rollout_seconds
            self.last_metrics["transfer_queue_seconds"] = queue_seconds + time.perf_counter() - clock

    # --- the step ------------------------------------------------------------------------

    def step(self, tasks: Sequence[Task], global_steps: int, version: int) -> list[RolloutTree]:
        """TRACE over ``tasks`` (the pool) with the step's budget; readiness on every leaf when
        credit is on; the predictor learns from the trees."""
        p = self.parts
        self.executor.sync_weights(None, version)
        session = RolloutSession(self.executor, seed=derive_seed(p.seed, "verl_step", global_steps), version=version)
        counters = self.counters
        start, tokens, before = time.perf_counter(), counters.stats.get("generated_tokens", 0), dict(counters.stats)
        planner = torch.Generator().manual_seed(derive_seed(p.seed, "verl_plan", global_steps))  # the same on resume
        if p.verl_reference is not None:  # its counts are the step's
            p.verl_reference.reset()
        counters.take_failed()
        take = getattr(self.executor, "take_metrics", None)
        if callable(take):
            take()  # the tree workers' counters are the step's (not a validation's before it)
        result = p.scheme.collect(session, list(tasks), p.budget, planner)
        failed = self.last_failed = counters.take_failed()
        kept = mark_failed(result.trees, failed)
        if p.reference is not None:
            session.score(kept)  # leaves of the last top-up are not scored by the scheme
        if p.verl_reference is not None:  # a tree whose readiness request failed fails as a whole, as for generation
            failed.update({t: why for t, why in p.verl_reference.take_failed().items() if t not in failed})
            kept = mark_failed(result.trees, failed)
        if result.cost.rollouts != p.budget:
            raise RuntimeError(f"step {global_steps}: the scheme spent {result.cost.rollouts} rollouts "
                               f"of the budget {p.budget}")
        seconds, tokens = time.perf_counter() - start, counters.stats.get("generated_tokens", 0) - tokens
        self.last_metrics = {**result.info, "leaves": float(p.budget), "rollout_seconds": seconds,
                             "generated_tokens": float(tokens), "rollout_tokens_per_s": tokens / max(seconds, 1e-9),
                             "failed_trees": float(len(failed)),
                             # where the step's wall time went: tree expansion (start + expand, the
                             # servers and tools) vs readiness scoring; the rest is planning
                             "generation_seconds": session.seconds["execute"],
                             "readiness_seconds": session.seconds["score"]}
        reported = counters.stats.get("reported_prompt_tokens", 0) - before.get("reported_prompt_tokens", 0)
        if reported:  # vLLM reports num_cached_tokens: the share of prompt tokens its prefix cache served
            cached = counters.stats.get("cached_prompt_tokens", 0) - before.get("cached_prompt_tokens", 0)
            self.last_metrics["prefix_cache_hit_rate"] = cached / reported
        if p.verl_reference is not None:  # rows, tokens forwarded against full-prefix rows, the check's gap
            self.last_metrics.update(p.verl_reference.metrics())
        if callable(take):  # the tree workers' share of the step
            self.last_metrics.update(take())
        if p.predictor is not None and kept:  # a failed tree says nothing about the policy
            clock = time.perf_counter()
            self.last_metrics.update(p.predictor.update(kept))
            self.last_metrics["predictor_seconds"] = time.perf_counter() - clock
        session.forget()
        self.last_trees = result.trees
        self._failures(failed, len(result.trees), global_steps)
        return result.trees

    def _failures(self, failed: dict[str, str], trees: int, global_steps: int) -> None:
        """Count a step in which at least half the trees failed; ``max_failed_steps`` such steps in
        a row stop the run in one line (a dead server, not a flaky request)."""
        self.failed_steps = self.failed_steps + 1 if failed and 2 * len(failed) >= trees else 0
        if self.failed_steps >= self.max_failed_steps:
            tree, why = next(iter(failed.items()))
            raise UserError(f"step {global_steps}: {len(failed)} of {trees} trees failed (tree {tree!r}: {why}); "
                            f"{self.failed_steps} steps in a row with at least half failed "
                            f"(tracerl.max_failed_steps = {self.max_failed_steps}): check verl's rollout servers")

    def validate(self, tasks: Sequence[Task], global_steps: int, version: int) -> list[RolloutTree]:
        """``val_kwargs.n`` chains per task, no planner (a plain evaluation of the policy)."""
        self.val_executor.sync_weights(None, version)
        session = RolloutSession(self.val_executor, seed=derive_seed(self.parts.seed, "verl_val", global_steps),
                                 version=version)
        self.counters.take_failed()
        trees, _ = session.start(list(tasks), [self.val_n] * len(tasks), [f"val-{t.id}" for t in tasks])
        self.last_failed = self.counters.take_failed()
        mark_failed(trees, self.last_failed)
        session.forget()
        return trees

    # --- checkpoints ---------------------------------------------------------------------

    def save_state(self, folder: str | Path) -> Path | None:
        """The predictor's state into verl's checkpoint ``folder`` (:data:`PREDICTOR_FILE`, written
        to a temporary name and renamed); the file's path, or None without a predictor."""
        if self.parts.predictor is None:
            return None
        return save_predictor_state(self.parts.predictor.state_dict(), folder)

    def load_state(self, folder: str | Path) -> None:
        """Restore :meth:`save_state`'s predictor state; a checkpoint without it, or one holding
        anything but tensors and plain data (a pickle that would run code), is refused."""
        if self.parts.predictor is None:
            return
        self.parts.predictor.load_state_dict(load_predictor_state(folder))


WORKER_BUILD = "tracerl.integrations.verl.workers:expansion_parts"
"""What tree workers build their environment and engine with (:func:`.workers.expansion_parts`)."""
EXPANSIONS = ("workers", "driver")
"""Values of ``+tracerl.expansion``: where trees are expanded (module docstring)."""


def build_parts(config: Any) -> TraceParts:
    """:class:`TraceParts` from ``config.tracerl``: ``preset``, ``config_file`` (a tracerl YAML) and
    ``overrides`` (``a.b=value`` strings), resolved as ``tracerl train`` would. Tokenizer and the
    frozen reference come from verl's ``actor_rollout_ref.model`` (``path``, ``tokenizer_path``,
    ``trust_remote_code``; :func:`check_model_path`: the reference is the actor's initial policy);
    tracerl ``optim`` settings verl would not apply are refused (:func:`check_optim`); the environment is ``data.environment`` over the
    run's documents; the scheme, predictor and budget are ``rollout``'s.

    ``+tracerl.readiness`` says where the frozen reference scores readiness: ``in_process`` (the
    default: an HF copy in this process, verl's TaskRunner, a Ray actor that starts with
    ``OMP_NUM_THREADS=1``; on the CPU its torch threads are set explicitly from tracerl's
    ``model.threads``, 0: the cores this process may use, and a reference over 1B parameters on the
    CPU is warned about in one line) or ``reference_worker`` (verl's own reference worker, through
    the ``tracerl_sync`` trainer: :mod:`.reference`; only the tokenizer is loaded here) or
    ``reference_server`` (frozen-reference servers on GPUs of their own that the ``tracerl_sync``
    trainer starts and verl hands over as ``teacher_client``: :mod:`.readiness`).
    ``+tracerl.check=true`` loads the HF copy beside it and logs the largest readiness difference
    (``tracerl/readiness_max_abs_diff``); the trainer then also compares every advantage.

    ``+tracerl.expansion`` says where trees are expanded: ``workers`` (the default: verl's
    ``agent.num_workers`` tree workers build the environment, :mod:`.workers`; none is built here)
    or ``driver`` (this process, over an environment built here)."""
    from tracerl.agent.formats import get_format
    from tracerl.allocation.predictor import SuccessPredictor
    from tracerl.allocation.schemes import get_scheme
    from tracerl.envs.verifiers import get_verifier
    from tracerl.models.precision import DTYPES
    from tracerl.models.scoring import EMPTY_THINK
    from tracerl.models.threads import set_threads
    from tracerl.config.schema import resolve_config
    from tracerl.train.data import load_task_data, run_environment

    cfg = tracerl_config(config)
    section = config.tracerl
    preset = str(section.get("preset", "trace"))
    expansion = str(section.get("expansion", "workers"))
    if expansion not in EXPANSIONS:
        raise UserError(f"tracerl.expansion = {expansion!r} is not valid; allowed values: {', '.join(EXPANSIONS)}")
    readiness = str(section.get("readiness", "in_process"))
    if readiness not in READINESS:
        raise UserError(f"tracerl.readiness = {readiness!r} is not valid; allowed values: {', '.join(READINESS)}")
    check_model_path(config, cfg.model.name_or_path, resolve_config(preset).model.name_or_path)
    threads = set_threads(cfg.model.threads, cfg.model.device)
    on_worker = cfg.algo.credit and readiness != "in_process"  # weights in verl's reference worker or servers
    check = bool(section.get("check", False))
    check_optim(config, cfg.optim, resolve_config(preset).optim)
    tokenizer = verl_tokenizer(config)  # verl's tokenizer_path and trust_remote_code, as its actor's
    model = None
    if not on_worker or check:  # on the worker alone, the weights stay in verl's reference worker
        model = reference_model(config, dtype=cfg.model.dtype, device=cfg.model.device, seed=cfg.seed)
        size = sum(p.numel() for p in model.parameters())
        if cfg.algo.credit and not on_worker and threads is not None and size > 1e9:
            warnings.warn(f"the frozen reference ({size / 1e9:.1f}B parameters) scores readiness on this process's "
                          f"CPU with {threads} torch threads: expect hours a step; set +tracerl.readiness="
                          "reference_worker (verl's reference worker) or tracerl model.device=cuda", stacklevel=2)
    fmt = get_format(cfg.model.format, tokenizer=tokenizer, system=cfg.model.system_prompt, tool_list=cfg.model.tool_list)
    environment, build = None, None
    if expansion == "driver":
        documents = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).documents
        environment = run_environment(documents, cfg.data, cfg.rollout.engine)
    else:
        build = WORKER_BUILD
    reference, verl_reference = None, None
    prefix = EMPTY_THINK if cfg.algo.score_after_empty_think else ""
    if cfg.algo.credit:
        reference, verl_reference = readiness_scorer(
            readiness, None if on_worker else model, tokenizer, fmt, answer_prefix=prefix,
            dtype=DTYPES["bfloat16"] if cfg.model.dtype == "bfloat16" else None,
            timeout_s=failure_settings(section)[0], check=model if on_worker else None)
    predictor = SuccessPredictor(cfg.predictor) if cfg.uses_predictor else None
    if predictor is not None and cfg.predictor.uses_hidden:
        raise UserError(f"predictor.features = {cfg.predictor.features!r}: verl's servers return no hidden states; "
                        "use predictor.features = handcrafted")
    scheme = get_scheme(cfg.rollout.scheme, cfg.rollout.schemes, predictor, reference is not None)
    return TraceParts(tokenizer, fmt, environment, get_verifier(cfg.data.verifier), cfg.rollout.engine, scheme,
                      cfg.rollout.budget, predictor, reference, cfg.seed, verl_reference, build)
