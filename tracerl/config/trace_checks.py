"""Cross-field checks of the TRACE options beside the papers' forms (docs/TRACE.md sections 2-3).

Each option is validated in its own dataclass; what needs two sections (the agent format and the
scoring prefix, the scheme and its allocation mode) is checked here, once, from
``TrainConfig.__post_init__``, and raises :class:`ConfigError` naming the fields.
"""

from __future__ import annotations

from typing import Any

from tracerl.config.loading import ConfigError

THINK_FORMATS = ("chat", "search_r1")
"""Formats whose answer turns may open with a think block (``algo.score_after_empty_think``)."""


def check_trace_options(cfg: Any) -> None:
    """Raise :class:`ConfigError` when TRACE options contradict the rest of ``cfg`` (a TrainConfig)."""
    if cfg.algo.score_after_empty_think and cfg.model.format not in THINK_FORMATS:
        raise ConfigError(f"algo.score_after_empty_think needs model.format in {', '.join(THINK_FORMATS)} "
                          f"(a format with think blocks), got {cfg.model.format!r}")
    _check_stage1(cfg)


def _check_stage1(cfg: Any) -> None:
    """The stage-1 options must fit the budget: a floor on every candidate, coverage's prompts."""
    if cfg.rollout.scheme != "trace":
        return
    s, budget = cfg.rollout.schemes, cfg.rollout.budget
    stage1 = max(s.min_per_prompt, round(s.trace_stage1_fraction * budget))
    if s.trace_root_mode == "coverage":
        if s.trace_explore_fraction > 0:
            raise ConfigError("rollout.schemes.trace_explore_fraction must be 0 with trace_root_mode = 'coverage' "
                              "(coverage already trains every prompt chain would)")
        prompts, floor = budget // s.group_size, max(2, s.trace_floor_per_prompt)
        if prompts < 1 or prompts > cfg.rollout.pool_size or prompts * floor > stage1:
            raise ConfigError(f"rollout.schemes.trace_root_mode = 'coverage' trains budget // group_size = {prompts} "
                              f"prompts with at least {floor} stage-1 rollouts each; it needs 1 <= {prompts} <= "
                              f"rollout.pool_size ({cfg.rollout.pool_size}) and {prompts} x {floor} <= stage 1's "
                              f"{stage1} rollouts")
        return
    candidates = min(cfg.rollout.pool_size, s.trace_candidates or cfg.rollout.pool_size)
    if s.trace_floor_per_prompt * candidates > stage1:
        raise ConfigError(f"rollout.schemes.trace_floor_per_prompt = {s.trace_floor_per_prompt} on each of {candidates} "
                          f"candidates exceeds stage 1's {stage1} rollouts (trace_stage1_fraction x rollout.budget); "
                          f"lower it or rollout.pool_size / trace_candidates")
