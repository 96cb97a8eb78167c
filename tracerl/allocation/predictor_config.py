"""The success predictor's settings (``predictor.*`` in the run config): :class:`PredictorConfig`.

Its own module because both the predictor (:mod:`tracerl.allocation.predictor`, which re-exports
it) and the network it builds (:mod:`tracerl.allocation.predictor_net`) read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

FEATURE_SETS: tuple[str, ...] = ("handcrafted", "hidden", "both")
ROOT_TARGETS: tuple[str, ...] = ("backup", "stage1")


@dataclass
class PredictorConfig:
    """Size and online-training schedule of the success predictor."""

    hidden: int = 16
    """Hidden units of the one-layer MLP; 0 makes it a logistic regression."""
    lr: float = 0.01
    """Adam learning rate of the predictor's own optimizer."""
    steps_per_update: int = 50
    """Gradient steps taken after each training step's trees arrive."""
    batch_size: int = 256
    """Replay minibatch size (the whole buffer when it is smaller)."""
    buffer_size: int = 20000
    """Most recent nodes kept for replay (oldest dropped first)."""
    prompt_table_size: int = 10000
    """Most recently seen prompts whose running success rate is remembered."""
    train_nodes: Literal["all", "boundaries"] = "all"
    """Train and score on every node ("all", the spec) or on branchable boundaries only."""
    readiness_eps: float = 0.1
    """``eps`` of the remaining gap used to turn readiness ``l_k`` into ``V_k`` (spec section 2)."""
    seed: int = 0
    """Seeds the model's initial weights and the replay sampling."""
    features: str = "handcrafted"
    """Predictor input: ``handcrafted`` (the 13 history features), ``hidden`` (the policy's
    last-layer hidden state at the node's last token, recorded by the generation forward that
    already runs, scaled by ``1/sqrt(H)``, plus a presence flag) or ``both``; the state enters
    through a centred linear head added to the features' MLP (``predictor_net.StateHead``).
    ``hidden``/``both`` need the HF backend (vLLM does not return hidden states)."""
    root_targets: str = "backup"
    """The root's target: ``backup`` (the spec's visit-weighted mean of all leaves) or ``stage1``
    (the mean reward of the rollouts that started at the root, weighted by their number: an
    unbiased sample of the prompt's success rate; see ``allocation/root_targets.py``)."""

    def __post_init__(self) -> None:
        positive = {
            "steps_per_update": self.steps_per_update,
            "batch_size": self.batch_size,
            "buffer_size": self.buffer_size,
            "prompt_table_size": self.prompt_table_size,
        }
        for name, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PredictorConfig.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 0:
            raise ValueError(f"PredictorConfig.hidden must be an integer >= 0, got {self.hidden!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"PredictorConfig.lr must be a finite number > 0, got {self.lr!r}")
        if self.train_nodes not in ("all", "boundaries"):
            raise ValueError(f"PredictorConfig.train_nodes must be 'all' or 'boundaries', got {self.train_nodes!r}")
        if self.features not in FEATURE_SETS:
            raise ValueError(f"PredictorConfig.features must be one of {', '.join(FEATURE_SETS)}, got {self.features!r}")
        if self.root_targets not in ROOT_TARGETS:
            raise ValueError(f"PredictorConfig.root_targets must be one of {', '.join(ROOT_TARGETS)}, "
                             f"got {self.root_targets!r}")
        if not (isinstance(self.readiness_eps, (int, float)) and self.readiness_eps > 0):
            raise ValueError(f"PredictorConfig.readiness_eps must be > 0, got {self.readiness_eps!r}")


    @property
    def uses_handcrafted(self) -> bool:
        return self.features in ("handcrafted", "both")

    @property
    def uses_hidden(self) -> bool:
        return self.features in ("hidden", "both")
