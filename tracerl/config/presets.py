"""Named training configs (spec section 4): the methods as presets over one loop and budget, the
allocation 2x2 ablation arms, and the ``--smoke`` / ``--smoke-random`` overlays.

Each preset is a partial config (a nested dict) laid over the defaults by
:func:`~tracerl.config.schema.resolve_config`: defaults < preset < ``--smoke`` < YAML file < ``--set``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tracerl.testbed.tiny_config import SMOKE_WORLD
from tracerl.config.loading import ConfigError, merge

# Methods as presets (spec section 4): the same loop and budget, different scheme/estimator.
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "grpo"}},
    "dapo": {"rollout": {"scheme": "dapo"}, "algo": {"estimator": "grpo"}},
    "gigpo": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "gigpo"}},
    "gspo": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "grpo", "policy_loss": "gspo"},
             "optim": {"loss_agg": "seq-mean-token-mean"}},
    "tree_grpo": {"rollout": {"scheme": "tree_random"}, "algo": {"estimator": "tree_grpo"}},
    "trace_alloc": {"rollout": {"scheme": "trace"}, "algo": {"estimator": "tree_anchor"}},
    "trace_credit": {"rollout": {"scheme": "chain"}, "algo": {"estimator": "trace_credit", "credit": True}},
    "trace": {"rollout": {"scheme": "trace"}, "algo": {"estimator": "trace_credit", "credit": True}},
}

# Allocation 2x2 ablation (issue 13): trace_alloc with uniform roots and/or uniform prefixes; the
# estimator, budget and everything else stay trace_alloc's (learned + learned is trace_alloc itself).
PRESETS.update({
    f"trace_alloc_{r[0]}{p[0]}": merge(PRESETS["trace_alloc"], {
        "rollout": {"schemes": {"trace_roots": r, "trace_prefixes": p}}})
    for r, p in (("uniform", "uniform"), ("uniform", "learned"), ("learned", "uniform"))
})

# Mechanism arms: what in TRACE allocation moves the credit testbed. The 2x2 "tree x learned roots",
# all at budget 64 with trace_alloc's estimator (tree_anchor, which equals grpo on chains):
#   tree on,  learned roots: trace_alloc       tree on,  uniform roots: trace_alloc_ul
#   tree off, learned roots: trace_alloc_notree (stage 1 spends the whole budget: every rollout a
#                            chain from a root the predictor chose, no prefix expansion)
#   tree off, uniform roots: grpo (uniform stage 1 is chain's shape, 8 prompts x 8; no preset needed)
# Beside it, GRPO with trace_alloc_ul's group shape (4 prompts x 16 leaves: 4 groups of 8 roots,
# each prompt's 8 continuations joining its group) and GRPO trained on two-hop prompts only (stage 1's
# choice on the credit testbed, 99.5% two-hop), evaluated on every hop count as the others.
PRESETS.update({
    "trace_alloc_notree": merge(PRESETS["trace_alloc"], {"rollout": {"schemes": {"trace_stage1_fraction": 1.0}}}),
    "grpo_4x16": merge(PRESETS["grpo"], {"rollout": {"schemes": {"group_size": 16}}}),
    "grpo_twohop": merge(PRESETS["grpo"], {"data": {"train_hops": [2]}}),
})

# Options beside the papers' forms (docs/TRACE.md sections 2-3, "departures"): each preset changes one
# knob of trace_alloc (allocation) or trace_credit (credit), so an arm reads as that knob's effect.
_ALLOC_OPTIONS: dict[str, dict[str, Any]] = {
    # every pool prompt gets a pair (the spec's m_min = 2); stage 1 grows to 3/4 of the budget so the
    # DP still places 16 rollouts of the default 64 beyond the 16 x 2 floor
    "floor": {"rollout": {"schemes": {"trace_floor_per_prompt": 2, "trace_stage1_fraction": 0.75}}},
    "coverage": {"rollout": {"schemes": {"trace_root_mode": "coverage"}}},
    "explore": {"rollout": {"schemes": {"trace_explore_fraction": 0.25}}},  # one group of 8 of stage 1's 32
    "rootstage1": {"predictor": {"root_targets": "stage1"}},
}
PRESETS.update({f"trace_alloc_{name}": merge(PRESETS["trace_alloc"], extra) for name, extra in _ALLOC_OPTIONS.items()})
_CREDIT_OPTIONS: dict[str, dict[str, Any]] = {
    "k1": {"horizon": 1},  # short horizons: with 1-3 tool calls every K = 3 window reaches the end
    "gated": {"credit_centre": "gated"},
    "gated_k1": {"credit_centre": "gated", "horizon": 1},
    "gated_turn": {"credit_centre": "gated_turn"},
    "clip": {"credit_clip": 0.2},  # |w_turn c_k| <= 0.2: one nat of log-ratio at the default w_turn
    "once": {"credit_fill": "once"},
}
PRESETS.update({f"trace_credit_{name}": merge(PRESETS["trace_credit"], {"algo": {"advantage": extra}})
                for name, extra in _CREDIT_OPTIONS.items()})

# `--smoke-random`: a randomly initialised tiny model on a tiny world; a few steps run in seconds. Its
# vocabulary is built from the run's format and tools, so it serves custom ones (but never calls a tool).
SMOKE_RANDOM: dict[str, Any] = {
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

# `--smoke`: the same run on the smoke-pretrained tiny model (pretrained once in about 30 s on one CPU
# core, then cached) sampled a little cooler, so a run of seconds calls tools, rewards some episodes
# and (with credit on) scores readiness. Its vocabulary is fixed: react format, search and open only.
# Training questions are one-hop, the ones that model answers (about 10-20% of rollouts): with two-hop
# questions in the pool, whether any of a 2-step run's 32 rollouts earned a reward depended on the
# float rounding of the CPU that pretrained the model.
SMOKE: dict[str, Any] = merge(SMOKE_RANDOM, {"model": {"name_or_path": "tiny", "tiny_preset": "smoke"},
                                             "data": {"world": {"max_hops": 1}},
                                             "rollout": {"engine": {"temperature": 0.7}}})

SMOKE_OVERLAYS: dict[str, dict[str, Any]] = {"pretrained": SMOKE, "random": SMOKE_RANDOM}
"""``smoke=`` of :func:`~tracerl.config.schema.resolve_config`: ``True`` is ``"pretrained"`` (``--smoke``)."""


def smoke_overlay(smoke: bool | str) -> dict[str, Any] | None:
    """The overlay of ``smoke`` (False: none; True or "pretrained": ``--smoke``; "random": ``--smoke-random``)."""
    if smoke is False or smoke is None:
        return None
    mode = "pretrained" if smoke is True else smoke
    if mode not in SMOKE_OVERLAYS:
        raise ConfigError(f"smoke must be True, False, 'pretrained' or 'random', got {smoke!r}")
    return SMOKE_OVERLAYS[mode]
