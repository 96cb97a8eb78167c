"""The training loop, readable top to bottom (see :meth:`Trainer.step`).

pick prompts -> rollout scheme (a planner sending requests to the executor) -> rewards (verified
inside the engine) -> reference readiness when credit is on (the executor's score call) ->
advantages -> clipped-PPO update -> weights synced to the backend -> predictor update -> log +
checkpoint.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np
import torch

from tracerl.agent.formats import get_format
from tracerl.allocation.predictor import SuccessPredictor
from tracerl.allocation.schemes import get_scheme
from tracerl.allocation.session import RolloutSession
from tracerl.core.advantages import AdvantageBatch, get_estimator
from tracerl.core.seeds import derive_seed
from tracerl.core.types import Trajectory
from tracerl.envs.coverage import check_tokenizer_coverage, check_tool_coverage
from tracerl.envs.health import ToolHealth, ToolStats
from tracerl.models.factory import make_reference_engine
from tracerl.models.lora import apply_lora, trainable_parameters
from tracerl.models.memory import enable_gradient_checkpointing
from tracerl.models.precision import DTYPES, compute_context, grad_scaler
from tracerl.models.scoring import EMPTY_THINK, ReferenceScorer
from tracerl.runs.trace_metrics import TraceMetrics

from tracerl.config.loading import ConfigError
from tracerl.config.schema import TrainConfig
from tracerl.train.data import load_task_data, take_pool
from tracerl.runs.divergence import DivergenceError, DivergenceMonitor, DivergenceRollback, step_signals
from tracerl.runs.metrics import MetricsLog
from tracerl.rollout.progress import step_progress
from tracerl.runs.rollout_log import RolloutLog
from tracerl.runs.state import INITIAL, NonFiniteTrainingError, RunLifecycle  # noqa: F401 - INITIAL re-exported
from tracerl.train.update import policy_update, update_settings, with_trainer_logprobs
from tracerl.train.executors import LiveParts, build_executor, worker_spec



def lr_lambda(config: TrainConfig) -> Callable[[int], float]:
    """Linear warmup, then constant, cosine or linear decay over ``config.steps``."""
    warmup, total, kind = config.optim.warmup_steps, max(config.steps, 1), config.optim.schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if kind == "linear":
            return 1.0 - progress
        return 1.0

    return factor


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer(RunLifecycle):
    """Owns every component of a run; ``run()`` trains, ``step()`` is one training step.

    The run folder's lifecycle (claim and lock, ``initial/``, :meth:`save`, resume, :meth:`close`)
    is inherited from :class:`~tracerl.runs.state.RunLifecycle`."""

    show_progress = False
    """Print the rollout phase's status line (:mod:`tracerl.rollout.progress`); the console sets it."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False,
                 echo: Callable[[str], None] | None = None,
                 start_driver: Callable[[Trainer], Any] | None = None) -> None:
        """Own ``run_dir`` (locked until :meth:`close`) and build every component.

        Fresh start (``resume=False``): ``run_dir`` must hold no run state. ``resume=True``:
        continue from ``LATEST``; with no checkpoint yet, start over from step 0 (the partial
        state of a run killed before its first checkpoint is discarded). ``start_driver``: with
        ``dist.nproc > 1``, rank 0's hook that shards the policy over the process group and returns
        the driver of the sharded update (:func:`tracerl.distributed.trainer.start_driver`, which
        ``tracerl train --nproc N`` hands in).
        """
        self.config, self.run_dir, self.echo = config, Path(run_dir), echo or (lambda _: None)
        self._start_driver = start_driver
        self.resume_from = self._claim_run_folder(resume)
        try:
            self._build(config)
        except BaseException:
            self.close(discard=self.resume_from is None and not resume)
            raise

    def _build(self, cfg: TrainConfig) -> None:
        _seed_everything(cfg.seed)
        self.fmt = get_format(cfg.model.format, system=cfg.model.system_prompt,  # text only: random-tiny's vocabulary
                              tool_list=cfg.model.tool_list)
        self.data = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed)
        self.tasks = {t.id: t for t in self.data.train + self.data.held_out + self.data.redrawn}
        self.model, self.tokenizer = self._initial_policy()
        # Fail before training when the tokenizer cannot read the data (e.g. the word-level tiny model
        # on real text: most gold answers are <unk>, so every reward and reference score is noise).
        coverage = check_tokenizer_coverage(self.tokenizer, self.data.train + self.data.held_out,
                                            self.data.documents, seed=cfg.seed)
        for line in coverage.warnings:
            warnings.warn(f"tokenizer coverage: {line}", stacklevel=2)
        self.fmt = get_format(cfg.model.format, tokenizer=self.tokenizer, system=cfg.model.system_prompt,
                              tool_list=cfg.model.tool_list)
        for line in check_tool_coverage(self.tokenizer, self.data.environment.tools, self.fmt, self.data.train[0]):
            warnings.warn(f"tokenizer coverage: {line}", stacklevel=2)  # an <unk> tool name is refused above
        self.model = prepare_policy(self.model, cfg)
        needs_reference = cfg.algo.credit or cfg.optim.kl_coef > 0
        # The frozen reference needs no float32 master copy: keep it in the working precision.
        # float16 is different: autocast only keeps float32 weights' residual stream and norms out of
        # float16, so a float16 reference would overflow on large activations; it stays float32.
        ref_dtype = DTYPES["bfloat16"] if cfg.model.dtype == "bfloat16" else None
        self.reference = (ReferenceScorer(self.model, self.tokenizer, self.fmt, dtype=ref_dtype,
                                          answer_prefix=EMPTY_THINK if cfg.algo.score_after_empty_think else "")
                          if needs_reference else None)
        self.reference_engine = None  # algo.reference_backend = vllm: readiness from a frozen vLLM engine
        if self.reference is not None and cfg.algo.credit and cfg.algo.reference_backend == "vllm":
            # built from the reference copy (the initial policy, also on resume) and never synced
            self.reference_engine = make_reference_engine(cfg.model, self.reference.model, self.tokenizer,
                                                          seed=cfg.seed)
            self.reference.batch_scorer = self.reference_engine
        # rollout.executor: the trainer reaches the policy backend only through it (the HF backend shares self.model)
        live = LiveParts(self.model, self.tokenizer, self.fmt, self.data.environment, self.reference)
        self.executor = build_executor(worker_spec(cfg, self.run_dir / INITIAL), live)
        self.predictor = SuccessPredictor(cfg.predictor) if cfg.uses_predictor else None
        self.trace_metrics = TraceMetrics(cfg.algo.estimator, cfg.algo.advantage)  # strata, credit readings
        self.scheme = get_scheme(cfg.rollout.scheme, cfg.rollout.schemes, self.predictor,
                                 self.reference is not None and cfg.algo.credit)
        recompute = cfg.optim.recompute_old_logprobs
        other_sampler = cfg.model.backend != "hf" or cfg.model.generation_dtype != "auto"  # vLLM, or the bf16 copy
        self.recompute_old_logprobs = recompute == "always" or (recompute == "auto" and other_sampler)
        self.estimator = get_estimator(cfg.algo.estimator)
        o = cfg.optim
        # AdamW over float32 master weights (only the adapters under LoRA); its state is float32 too.
        self.optimizer = torch.optim.AdamW(trainable_parameters(self.model), lr=o.lr, betas=o.betas,
                                           weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.driver = None  # dist.nproc > 1: FSDP2 over torchrun ranks, rank 0 driving (tracerl.distributed)
        if cfg.dist.nproc > 1:
            if self._start_driver is None:
                raise ConfigError(f"dist.nproc = {cfg.dist.nproc} trains over {cfg.dist.nproc} processes: start it "
                                  f"with `tracerl train ... --nproc {cfg.dist.nproc}` (its ranks drive and serve the "
                                  "sharded update)")
            self.driver = self._start_driver(self)
        self.scaler = grad_scaler(cfg.model.device, cfg.model.dtype)  # float16 on CUDA only
        self.update_settings = update_settings(cfg)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.step_index, self.cursor = 0, 0
        self.totals = {"rollouts": 0, "generated_tokens": 0}
        self.nonfinite = {"streak": 0, "total": 0}
        self.tool_health = ToolHealth(cfg.data.max_failed_tool_steps)
        self.divergence = DivergenceMonitor(cfg.optim.divergence, vocab_size=len(self.tokenizer))
        self.rolled_back: dict[str, Any] | None = None
        """Set when the divergence guard rolled the run back (``optim.divergence.mode=rollback``)."""
        self.log = MetricsLog(self.run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, config=cfg)
        self.rollout_log = RolloutLog(self.run_dir, self.tasks, enabled=cfg.log.rollouts,
                                      decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
                                      credit=cfg.algo.advantage if cfg.algo.credit else None)
        if self.resume_from is None:  # a (re)start from step 0 keeps no records of a lost attempt
            self.rollout_log.truncate_after(0)
        if self.resume_from is not None:
            self._restore(self.resume_from)

    # --- one step -------------------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        cfg, timings = self.config, {}
        self._peaks: dict[str, float] = {}
        clock = time.perf_counter()

        pool = take_pool(self.data.train, self.cursor, cfg.rollout.pool_size)
        self.model.eval()
        # Every generate row's seed derives from (run seed, step, tree, node, branch, turn); the
        # backend holds the weights of step_index optimiser steps (the version the requests ask for).
        session = RolloutSession(self.executor, derive_seed(cfg.seed, "step", self.step_index), self.step_index)
        with self._compute(), step_progress(cfg.rollout.budget, show=self.show_progress):  # status line (console only)
            result = self.scheme.collect(session, pool, cfg.rollout.budget, self.generator)
        tools = sum((ToolStats(**r) for r in session.tool_stats), ToolStats())  # read off the results
        self.tool_health.observe(tools)  # stops a run one of whose tools fails every call
        self.cursor += result.consumed
        trajectories = [t for tree in result.trees for t in tree.trajectories.values()]
        clock = self._phase_end(timings, "rollout", clock)

        rollout_inner = dict(session.seconds)  # executor time inside the scheme (the rest is planning)
        if cfg.algo.credit:
            with self._compute():
                session.score(result.trees)  # readiness of what the scheme did not score already
        clock = self._phase_end(timings, "scoring", clock)

        batch = AdvantageBatch(trajectories, {tree.tree_id: tree for tree in result.trees})
        advantages = self.estimator(batch, cfg.algo.advantage)
        clock = self._phase_end(timings, "advantages", clock)

        if cfg.model.vllm_sleep:  # the engine's KV memory serves the update, its weights wait on the host
            self.executor.sleep(level=1)
        update = self._update([(t, a) for t, a in zip(trajectories, advantages, strict=True) if not t.infra_failed])
        if cfg.model.vllm_sleep:
            self.executor.wake_up()
        self.executor.sync_weights(self._weights(), self.step_index + 1)  # the backend samples from the new weights
        clock = self._phase_end(timings, "update", clock)

        self.rollout_log.write(self.step_index + 1, result.trees, advantages, self.predictor)  # before the metrics line
        trace_record = self.trace_metrics.observe(pool, result.trees, self.tasks, batch, self.predictor)
        predictor_metrics = self.predictor.update(result.trees) if self.predictor is not None else {}
        self._phase_end(timings, "predictor", clock)
        session.forget()

        self.step_index += 1
        self.totals["rollouts"] += result.cost.rollouts
        self.totals["generated_tokens"] += result.cost.generated_tokens
        record = self._record(result, trajectories, update, predictor_metrics, timings)
        record.update(tool_calls=tools.calls, tool_failures=tools.failures, **self._peaks, **trace_record)
        record.update(step_signals(trajectories))  # valid-action rate and sampled entropy (divergence tests)
        record.update(time_rollout_execute=rollout_inner["execute"], time_rollout_readiness=rollout_inner["score"],
                      # generation throughput of the backend (hf or vllm): tokens over executor time
                      generated_tokens_per_s=result.cost.generated_tokens / max(rollout_inner["execute"], 1e-9))
        record.update(getattr(self.executor, "take_metrics", dict)())  # ray: sync time/bytes, faults, tokens/s per worker
        return record

    def _phase_end(self, timings: dict[str, float], name: str, since: float) -> float:
        """Close a phase: its time, and on CUDA its peak allocated memory (``peak_mem_gb_<phase>``)."""
        device = torch.device(self.config.model.device)
        if device.type == "cuda":
            self._peaks[f"peak_mem_gb_{name}"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
            torch.cuda.reset_peak_memory_stats(device)
        return _lap(timings, name, since)

    def _compute(self) -> ContextManager[Any]:
        """The working precision (``model.dtype``) for forwards: bf16/fp16 autocast or nothing.
        The update enters it itself around its forwards only, so backward runs outside autocast."""
        return compute_context(self.config.model.device, self.config.model.dtype)

    def _update(self, pairs: list[tuple[Trajectory, torch.Tensor]]) -> dict[str, float]:
        if not pairs:
            return {"loss": 0.0, "grad_norm": 0.0, "kl": 0.0, "clip_fraction": 0.0, "trained_tokens": 0.0,
                    "nonfinite_skipped": 0.0}
        if self.driver is not None:  # the sharded update on every rank; the sharded reference gives the KL
            return self.driver.update(pairs, self.config.optim.updates_per_step, self.recompute_old_logprobs,
                                      self.scheduler)
        # The scorer, not its model: its frozen() disables a LoRA adapter around the KL forward.
        reference = self.reference if (self.reference and self.config.optim.kl_coef > 0) else None
        merged: dict[str, float] = {}
        if self.recompute_old_logprobs:  # importance-sampling guard: the trainer's own old log-probs
            with torch.no_grad():
                trajectories, merged = with_trainer_logprobs(self.model, [p[0] for p in pairs],
                                                             self.update_settings, self.tokenizer.pad_token_id)
            pairs = [(t, a) for t, (_, a) in zip(trajectories, pairs, strict=True)]
        chunks = np.array_split(np.arange(len(pairs)), min(self.config.optim.updates_per_step, len(pairs)))
        for chunk in chunks:
            part = [pairs[i] for i in chunk]
            metrics = policy_update(self.model, self.optimizer, [p[0] for p in part], [p[1] for p in part],
                                    self.update_settings, self.tokenizer.pad_token_id, reference, self.scaler)
            for key, value in metrics.items():  # counts add up over the optimiser steps; the rest is averaged
                merged[key] = merged.get(key, 0.0) + (value if key in _COUNT_KEYS else value / len(chunks))
        with warnings.catch_warnings():  # the schedule follows RL steps, also those whose update was skipped
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        return merged

    def _record(self, result: Any, trajectories: list[Trajectory], update: dict[str, float],
                predictor: dict[str, float], timings: dict[str, float]) -> dict[str, Any]:
        valid = [t for t in trajectories if not t.infra_failed]
        credit = [c for t in valid if t.readiness for c in _value_gain(t)]
        record: dict[str, Any] = {
            "step": self.step_index,
            "reward_mean": float(np.mean([t.reward for t in valid])) if valid else 0.0,
            "accuracy": float(np.mean([t.reward > 0.5 for t in valid])) if valid else 0.0,
            "effective_ratio": result.effective_ratio,
            "rollouts": result.cost.rollouts,
            "generated_tokens": result.cost.generated_tokens,
            "total_rollouts": self.totals["rollouts"],
            "total_generated_tokens": self.totals["generated_tokens"],
            "prompts": len(result.trees),
            "trajectories": len(trajectories),
            "infra_failed": len(trajectories) - len(valid),
            "turns_mean": float(np.mean([len(t.turns) for t in valid])) if valid else 0.0,
            "lr": self.scheduler.get_last_lr()[0],
            "readiness_gain_mean": float(np.mean(credit)) if credit else None,
            **update,
            **{f"predictor_{k}": v for k, v in predictor.items()},
            **{f"scheme_{k}": v for k, v in result.info.items()},
            **{f"time_{k}": v for k, v in timings.items()},
            "step_seconds": sum(timings.values()),
        }
        return record

    # --- evaluation -------------------------------------------------------------------------

    def evaluate(self, tasks: list, label: str = "eval") -> dict[str, float]:
        """Accuracy on ``tasks`` with a generator of its own, so evaluating never shifts training."""
        self.model.eval()
        with self._compute():  # the executor clears its prefix cache after (evaluation's KV must not serve training)
            metrics = self.executor.evaluate(tasks[: self.config.eval.size], samples=1,
                                             seed=self.config.seed + 7919 * self.step_index)
        by_hops = {f"{label}_accuracy_hops{key[len('em_hops'):]}": value
                   for key, value in metrics.items() if key.startswith("em_hops")}
        return {f"{label}_accuracy": metrics["em"], f"{label}_f1": metrics["f1"],
                f"{label}_turns": metrics["mean_turns"], **by_hops}

    # --- the run ----------------------------------------------------------------------------

    def run(self, steps: int | None = None, *, deadline: float | None = None) -> list[dict[str, Any]]:
        """Train until ``steps`` total steps (default ``config.steps``) or the ``time.perf_counter()``
        ``deadline``; evaluate every ``eval.every`` steps and at the last step, checkpoint as configured.

        A step's metrics line is fsynced before its checkpoint is written, so a kill loses at most
        the step in flight: on resume, lines after the checkpoint are dropped and those steps rerun.
        """
        target = self.config.steps if steps is None else steps
        records = []
        if self.config.eval.at_start and self.step_index == 0 and target > 0:
            records.append(self._evaluate_at_start())
        while self.step_index < target and (deadline is None or time.perf_counter() < deadline):
            record = self.step()
            every, last = self.config.eval.every, self.step_index == target
            if (every and self.step_index % every == 0) or last:
                record.update(self.evaluate(self.data.held_out))
            self._count_nonfinite(record)
            self.log.write(record)
            self.echo(record)
            records.append(record)
            self._stop_if_nonfinite_streak()
            try:
                self.divergence.observe(record, self._last_good)  # stops (or warns) when training collapsed
            except DivergenceRollback as diverged:
                self._roll_back(diverged)
                break
            if self.step_index % self.config.log.checkpoint_every == 0 or last:
                self.save()
        return records

    def _roll_back(self, diverged: DivergenceRollback) -> None:
        """Restore the newest checkpoint written before the divergence began and end the run
        there; the later records and checkpoints are kept aside (runs/rollback.py)."""
        from tracerl.runs.rollback import good_checkpoint, set_aside

        fired_at = self.step_index
        good = good_checkpoint(self.run_dir, diverged.onset)
        if good is None:
            raise DivergenceError(f"{diverged}. It began at step {diverged.onset} and no checkpoint of step "
                                  f"{max(diverged.onset - 2, 0)} or before is left to roll back to; lower optim.lr "
                                  "or checkpoint more often (log.checkpoint_every, log.keep_last)")
        aside = set_aside(self.run_dir, good, fired_at)
        self._restore(good)
        self.rolled_back = {"fired_at": fired_at, "onset": diverged.onset, "to_step": self.step_index,
                            "checkpoint": str(good), "set_aside": str(aside), "why": str(diverged)}
        self.echo_line(f"{diverged}; rolled back to {good.name} (step {self.step_index}) and stopped there; the "
                       f"records of steps {self.step_index + 1}..{fired_at} are in {aside}")

    def echo_line(self, line: str) -> None:
        """A line for the person watching (stderr; the demo shows it on its console)."""
        print(line, file=sys.stderr, flush=True)

    def _evaluate_at_start(self) -> dict[str, Any]:
        """A step-0 record with the initial policy's held-out accuracy (``eval.at_start``): the first
        point of a learning curve. A resumed run at step 0 has lost that line and writes it again."""
        record: dict[str, Any] = {"step": 0, "total_rollouts": 0, "total_generated_tokens": 0,
                                  "rollouts": 0, "generated_tokens": 0, **self.evaluate(self.data.held_out)}
        self.log.write(record)
        self.echo(record)
        return record

    def _count_nonfinite(self, record: dict[str, Any]) -> None:
        """A step counts as skipped when any of its updates had a non-finite loss or gradient norm."""
        if float(record.get("nonfinite_skipped", 0.0) or 0.0) > 0:
            self.nonfinite["streak"] += 1
            self.nonfinite["total"] += 1
        else:
            self.nonfinite["streak"] = 0
        record["nonfinite_skipped_total"] = self.nonfinite["total"]

    def _stop_if_nonfinite_streak(self) -> None:
        limit = getattr(self.config.optim, "max_nonfinite_steps", 3)
        streak = self.nonfinite["streak"]
        if streak >= limit:
            raise NonFiniteTrainingError(
                f"steps {self.step_index - streak + 1}..{self.step_index} had a non-finite loss or gradient norm "
                f"and were skipped ({streak} in a row, optim.max_nonfinite_steps={limit}); stopping. "
                f"{self._last_good()}; lower optim.lr or check the rewards and rollout.engine.temperature")

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(discard=self.discards_after(exc[1] if isinstance(exc[1], BaseException) else None))


def prepare_policy(model: Any, config: TrainConfig) -> Any:
    """Gradient checkpointing and the LoRA adapter (float32, on a base kept in the working precision),
    as configured; otherwise the float32 model is returned as it is."""
    if config.optim.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    lora = config.model.lora
    if lora.r > 0:
        if config.model.dtype == "bfloat16":  # the frozen base needs no float32 master copy (not float16:
            model.to(dtype=torch.bfloat16)      # autocast protects only float32 weights from overflow)
        model.to(device=config.model.device)  # loaded on the CPU (see _initial_policy)
        model = apply_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules)
    return model


_COUNT_KEYS = ("trained_tokens", "update_forward_tokens", "unique_trained_tokens", "nonfinite_skipped",
               "scaler_skipped")
"""Update metrics that count (tokens, skipped optimiser steps): summed over ``optim.updates_per_step``."""


def _lap(timings: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    timings[name] = now - since
    return now


def _value_gain(traj: Trajectory) -> list[float]:
    """``l_T - l_0`` of a trajectory: how much its searches raised the reference's readiness."""
    assert traj.readiness is not None
    return [traj.readiness[-1] - traj.readiness[0]]

