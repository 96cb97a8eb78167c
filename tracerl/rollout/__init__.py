"""Batched multi-turn rollouts with tree branching, the executor protocol, and evaluation."""

from tracerl.rollout.engine import EngineConfig, RolloutCost, RolloutEngine
from tracerl.rollout.executor import ExpandRequest, LocalExecutor, RolloutExecutor, StartRequest
from tracerl.rollout.session import RolloutSession

__all__ = ["EngineConfig", "ExpandRequest", "LocalExecutor", "RolloutCost", "RolloutEngine", "RolloutExecutor",
           "RolloutSession", "StartRequest"]
