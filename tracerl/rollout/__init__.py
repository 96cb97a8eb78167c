"""Execution: batched multi-turn rollouts with tree branching, rollout executors, and evaluation."""

from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.executor import LocalExecutor, RolloutExecutor

__all__ = ["EngineConfig", "LocalExecutor", "RolloutEngine", "RolloutExecutor"]
