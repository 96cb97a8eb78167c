"""Named training configs (spec section 4): the methods as presets over one loop and budget, the
allocation 2x2 ablation arms, and the ``--smoke`` overlay.

Each preset is a partial config (a nested dict) laid over the defaults by
:func:`~tracerl.train.config.resolve_config`: defaults < preset < ``--smoke`` < YAML file < ``--set``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tracerl.testbed.tiny_config import SMOKE_WORLD
from tracerl.train.config_io import merge

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

# `--smoke-pretrained`: the smoke overlay on the smoke-pretrained tiny model (pretrained once in
# about 30 s on one CPU core, then cached) instead of a random one, sampled a little cooler, so a
# run of seconds calls tools, rewards some episodes and (with credit on) scores readiness.
SMOKE_PRETRAINED: list[str] = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "rollout.engine.temperature=0.7"]
