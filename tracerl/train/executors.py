"""Building the run's rollout executor from its config: :func:`worker_spec` and :func:`build_executor`.

A :class:`~tracerl.rollout.worker_spec.WorkerSpec` is everything a rollout worker needs to build
its executor (the run's config as plain data, the initial policy's folder, the seed, and this
module's :func:`build_executor` as the builder's import path): it pickles and crosses process
boundaries (a Ray actor receives one and calls the builder). :func:`build_executor` turns it into
the executor that ``rollout.executor`` names; the trainer uses it too, handing in the objects it
already holds (:class:`LiveParts`: its model, whose weights the HF backend then shares, its environment and
reference scorer) instead of loading them a second time. A worker without them loads the
initial policy (weights arrive with the next ``sync_weights``) and builds its own environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracerl.agent.formats import get_format
from tracerl.envs.verifiers import get_verifier
from tracerl.models.factory import make_backend
from tracerl.rollout.engine import RolloutEngine
from tracerl.rollout.executor import LocalExecutor
from tracerl.rollout.worker_spec import WorkerSpec
from tracerl.config.schema import TrainConfig
from tracerl.config.loading import ConfigError, from_dict, to_dict


BUILD = "tracerl.train.executors:build_executor"
"""The builder a :class:`WorkerSpec` names: what a Ray worker calls to build its local executor."""


@dataclass
class LiveParts:
    """Objects an in-process executor shares with the trainer instead of building them."""

    model: Any
    tokenizer: Any
    fmt: Any
    environment: Any
    reference: Any = None
    """The trainer's ``ReferenceScorer`` (its ``score_nodes`` scores readiness when credit is on)."""


def worker_spec(config: TrainConfig, initial_policy: str | Path, *, worker: str = "local", version: int = 0) -> WorkerSpec:
    """The spec of ``config``'s workers. A folder is made absolute: a Ray worker on an existing
    cluster runs in its own working directory, where ``runs/x/initial`` names nothing."""
    path = Path(initial_policy)
    source = str(path.resolve()) if path.exists() else str(initial_policy)  # else a hub name
    return WorkerSpec(to_dict(config), source, BUILD, config.seed, worker, version)


def build_executor(spec: WorkerSpec, live: LiveParts | None = None) -> Any:
    """The executor ``spec.config['rollout']['executor']`` names, built from ``spec`` (and ``live``).

    ``local``: a :class:`LocalExecutor`. The backend records hidden states when the predictor reads
    them (``predictor.features`` hidden/both with the trace scheme); the evaluation engine shares
    the backend at ``eval.temperature``. ``ray``: a ``RayExecutor`` whose actors each build the
    local one from ``spec`` (Ray is imported only then); with ``rollout.readiness_on = driver``
    it scores readiness with ``live``'s reference."""
    cfg = from_dict(TrainConfig, spec.config)
    if cfg.rollout.executor == "ray":
        from tracerl.rollout.ray_executor import RayExecutor

        driver_score = live.reference.score_nodes if (live is not None and live.reference is not None) else None
        return RayExecutor(spec, driver_score if cfg.algo.credit else None)
    if cfg.rollout.executor != "local":  # the config refuses other values; a spec may come from elsewhere
        raise ConfigError(f"rollout.executor = {cfg.rollout.executor!r} is not valid; allowed values: local, ray")
    parts = live if live is not None else _load_parts(cfg, spec)
    backend = make_backend(cfg.model, parts.model, parts.tokenizer, seed=spec.seed)
    if cfg.uses_predictor and cfg.predictor.uses_hidden:  # HF only (checked by the config)
        backend.record_states = True  # type: ignore[attr-defined]
    verifier = get_verifier(cfg.data.verifier)
    engine = RolloutEngine(backend, parts.environment, parts.fmt, verifier, cfg.rollout.engine)
    eval_cfg = replace(cfg.rollout.engine, temperature=cfg.eval.temperature)
    eval_engine = RolloutEngine(backend, parts.environment, parts.fmt, verifier, eval_cfg)
    score = parts.reference.score_nodes if (parts.reference is not None and cfg.algo.credit) else None
    return LocalExecutor(engine, score, eval_engine=eval_engine, worker=spec.worker, version=spec.version)


def _load_parts(cfg: TrainConfig, spec: WorkerSpec) -> LiveParts:
    """A worker's own model (the initial policy), format, environment and reference scorer."""
    from tracerl.testbed.loading import load_model
    from tracerl.models.precision import DTYPES
    from tracerl.models.scoring import EMPTY_THINK, ReferenceScorer
    from tracerl.train.data import load_task_data
    from tracerl.runs.initial import initial_source

    folder = Path(spec.initial_policy)
    source = initial_source(folder) if folder.is_dir() else spec.initial_policy  # initial/ may hold a reference
    model, tokenizer = load_model(source, dtype=cfg.model.dtype, device=cfg.model.device, seed=spec.seed)
    model.eval()
    fmt = get_format(cfg.model.format, tokenizer=tokenizer, system=cfg.model.system_prompt,
                     tool_list=cfg.model.tool_list)
    environment = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).environment
    reference = None
    if cfg.algo.credit:
        ref_dtype = DTYPES["bfloat16"] if cfg.model.dtype == "bfloat16" else None
        reference = ReferenceScorer(model, tokenizer, fmt, dtype=ref_dtype,
                                    answer_prefix=EMPTY_THINK if cfg.algo.score_after_empty_think else "")
    return LiveParts(model, tokenizer, fmt, environment, reference)
