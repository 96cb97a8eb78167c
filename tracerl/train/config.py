"""Training configuration: one dataclass per component, presets as named overlays.

Resolution order: defaults < preset < ``--smoke`` overlay < YAML file < ``--set a.b=value``.
Every field is validated when the config is built, so a bad run fails before it starts,
naming the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tracerl.allocation.predictor import PredictorConfig
from tracerl.core.advantages import AdvantageOptions, available_estimators
from tracerl.core.losses import available_aggregations
from tracerl.envs.synthwiki import WorldConfig
from tracerl.envs.verifiers import VERIFIERS
from tracerl.models.tiny_config import DEFAULT_WORLD, SMOKE_WORLD
from tracerl.rollout.engine import EngineConfig
from tracerl.rollout.schemes import SCHEME_NAMES, SchemeConfig
from tracerl.train.config_io import ConfigError, from_dict, load_yaml, merge, parse_override, to_dict


def _one_of(section: str, name: str, value: Any, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name} = {value!r} is not valid; allowed values: {', '.join(allowed)}")


def _positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {value}")


@dataclass
class DataConfig:
    """Where tasks and the corpus come from."""

    source: str = "synthwiki"
    """``synthwiki`` (the built-in world, re-drawn per training world) or ``files`` (JSONL)."""
    world: WorldConfig = DEFAULT_WORLD  # frozen, so one shared instance is safe
    """Names and sizes of SynthWiki worlds (those the embedded tiny model knows); the fact seed
    is replaced per world below."""
    train_worlds: int = 8
    """Re-drawn worlds (fact seeds ``first_fact_seed ..``) whose questions are trained on."""
    first_fact_seed: int = 1
    eval_fact_seed: int = 10_000
    """An unseen world (fresh fact seed, same names) for held-out accuracy."""
    redrawn_fact_seed: int = 20_000
    """Memorisation check: training-split questions of a world whose facts were re-drawn."""
    tasks: str = ""
    """``files`` source: training tasks JSONL."""
    corpus: str = ""
    """``files`` source: corpus JSONL."""
    eval_tasks: str = ""
    """``files`` source: held-out tasks JSONL."""
    search_top_k: int = 3
    """Documents returned by one ``search`` call."""
    verifier: str = "em"
    """Terminal reward: ``em`` (normalised exact match), ``f1`` or ``answered`` (format reward)."""
    shuffle: bool = True
    """Shuffle training tasks once (seeded); the data cursor walks that order."""

    def __post_init__(self) -> None:
        _one_of("data", "source", self.source, ["synthwiki", "files"])
        _one_of("data", "verifier", self.verifier, sorted(VERIFIERS))
        _positive("data", train_worlds=self.train_worlds, search_top_k=self.search_top_k)
        if self.source == "files" and not (self.tasks and self.corpus):
            raise ConfigError("data.source = 'files' needs data.tasks and data.corpus")


@dataclass
class ModelConfig:
    """The policy (and, frozen, the reference)."""

    name_or_path: str = "tiny"
    """``tiny`` (the embedded base model, pretrained once and cached), ``random-tiny`` (randomly
    initialised, for smoke runs) or a Hugging Face folder/name."""
    tiny_preset: str = "default"
    """Which embedded tiny-model preset ``tiny`` refers to."""
    format: str = "react"
    """Agent format: ``react`` (plain text, small models) or ``chat`` (the tokenizer's chat template
    with tool calls; the built-in Qwen3 markup for tokenizers without one)."""
    system_prompt: str = ""
    """System text of the prompt (``chat``: its default asks for tool calls and an <answer>)."""
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        _one_of("model", "format", self.format, ["react", "chat"])
        _one_of("model", "dtype", self.dtype, ["float32", "bfloat16", "float16"])


@dataclass
class RolloutConfig:
    """How a step's batch is sampled; the budget is counted in continuation rollouts."""

    scheme: str = "chain"
    budget: int = 64
    """Continuation rollouts per step (every scheme spends the same)."""
    pool_size: int = 16
    """Prompts offered to the scheme per step (trace chooses among them; chain takes budget/n)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    schemes: SchemeConfig = field(default_factory=SchemeConfig)

    def __post_init__(self) -> None:
        _one_of("rollout", "scheme", self.scheme, SCHEME_NAMES)
        _positive("rollout", budget=self.budget, pool_size=self.pool_size)
        floor = self.schemes.min_per_prompt
        if self.scheme == "trace" and self.budget < floor:
            raise ConfigError(
                f"rollout.budget = {self.budget} is below the {floor} rollouts trace gives a selected prompt at least "
                "(rollout.schemes.trace_min_per_prompt, or rollout.schemes.group_size when unset)"
            )


@dataclass
class AlgoConfig:
    """Advantage estimation and TRACE credit."""

    estimator: str = "grpo"
    credit: bool = False
    """Score every prefix with the frozen reference (needed by ``trace_credit``; also feeds the
    predictor's readiness features)."""
    advantage: AdvantageOptions = field(default_factory=AdvantageOptions)

    def __post_init__(self) -> None:
        _one_of("algo", "estimator", self.estimator, available_estimators())
        if self.estimator == "trace_credit" and not self.credit:
            raise ConfigError("algo.estimator = 'trace_credit' needs algo.credit = true")


@dataclass
class OptimConfig:
    """Clipped-PPO update with AdamW."""

    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    schedule: str = "constant"
    """``constant``, ``cosine`` or ``linear`` decay after ``warmup_steps``."""
    warmup_steps: int = 0
    micro_batch_size: int = 32
    """Trajectories per forward/backward; gradients accumulate to one optimiser step."""
    updates_per_step: int = 1
    """Optimiser steps per batch (the batch is split into this many mini-batches)."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    """DAPO clip-higher: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the frozen reference (0: off, no reference forward)."""
    loss_agg: str = "token-mean"

    def __post_init__(self) -> None:
        _one_of("optim", "schedule", self.schedule, ["constant", "cosine", "linear"])
        _one_of("optim", "loss_agg", self.loss_agg, available_aggregations())
        _positive("optim", lr=self.lr, grad_clip=self.grad_clip, micro_batch_size=self.micro_batch_size,
                  updates_per_step=self.updates_per_step)
        if self.kl_coef < 0 or self.warmup_steps < 0 or self.clip_low < 0 or self.clip_high < 0:
            raise ConfigError("optim.kl_coef, optim.warmup_steps, optim.clip_low and optim.clip_high must be >= 0")


@dataclass
class EvalConfig:
    every: int = 10
    """Evaluate held-out accuracy every this many steps (0: only at the end)."""
    size: int = 128
    """Held-out questions per evaluation."""
    temperature: float = 0.0
    """0: greedy decoding, the usual way to report accuracy."""

    def __post_init__(self) -> None:
        _positive("eval", size=self.size)
        if self.every < 0 or self.temperature < 0:
            raise ConfigError("eval.every and eval.temperature must be >= 0")


@dataclass
class LogConfig:
    tensorboard: bool = False
    wandb: bool = False
    checkpoint_every: int = 1
    """Write an atomic checkpoint every this many steps (and always at the end)."""

    def __post_init__(self) -> None:
        _positive("log", checkpoint_every=self.checkpoint_every)


@dataclass
class TrainConfig:
    """A whole training run."""

    preset: str = "grpo"
    steps: int = 100
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _one_of("<root>", "preset", self.preset, list(PRESETS))
        if self.steps < 0:
            raise ConfigError(f"steps must be >= 0, got {self.steps}")

    @property
    def uses_predictor(self) -> bool:
        return self.rollout.scheme == "trace"


# Methods as presets (spec section 4): the same loop and budget, different scheme/estimator.
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "grpo"}},
    "dapo": {"rollout": {"scheme": "dapo"}, "algo": {"estimator": "grpo"}},
    "gigpo": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "gigpo"}},
    "tree_grpo": {"rollout": {"scheme": "tree_random"}, "algo": {"estimator": "tree_grpo"}},
    "trace_alloc": {"rollout": {"scheme": "trace"}, "algo": {"estimator": "tree_grpo"}},
    "trace_credit": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "trace_credit", "credit": True}},
    "trace": {"rollout": {"scheme": "trace"}, "algo": {"estimator": "trace_credit", "credit": True}},
}

# `--smoke`: a randomly initialised tiny model on a tiny world; a few steps run in seconds.
SMOKE: dict[str, Any] = {
    "steps": 2,
    "model": {"name_or_path": "random-tiny"},
    "data": {
        "train_worlds": 2,
        "world": asdict(SMOKE_WORLD),  # the world the smoke tiny model knows
    },
    "rollout": {"budget": 16, "pool_size": 6, "engine": {"max_turns": 5, "max_turn_tokens": 16, "max_total_tokens": 512},
                "schemes": {"group_size": 4, "tree_initial": 2, "tree_rounds": 1, "tree_expand_nodes": 2,
                            "tree_continuations": 1}},
    "optim": {"micro_batch_size": 8},
    "eval": {"every": 0, "size": 8},
}


def resolve_config(
    preset: str, *, config_file: str | Path | None = None, overrides: list[str] | None = None, smoke: bool = False
) -> TrainConfig:
    """Defaults < preset < smoke < YAML file < ``a.b=value`` overrides, validated."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    # Start from the full defaults, so a partial override of a nested section (say
    # data.world.max_hops) keeps the section's other defaults instead of its class defaults.
    data: dict[str, Any] = merge(to_dict(TrainConfig()), {"preset": preset, **PRESETS[preset]})
    if smoke:
        data = merge(data, SMOKE)
    if config_file:
        data = merge(data, load_yaml(config_file))
    for text in overrides or []:
        data = merge(data, parse_override(text))
    return from_dict(TrainConfig, data)


def config_to_yaml(config: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def config_from_yaml(text: str) -> TrainConfig:
    return from_dict(TrainConfig, yaml.safe_load(text))
