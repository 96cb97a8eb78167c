"""Batched multi-turn rollouts with tree branching, and evaluation."""

from tracerl.rollout.engine import EngineConfig, RolloutCost, RolloutEngine

__all__ = ["EngineConfig", "RolloutCost", "RolloutEngine"]
