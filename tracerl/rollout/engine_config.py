"""The rollout engine's config: episode limits, sampling and scheduling (:class:`EngineConfig`).

Its own module because both the engine (:mod:`tracerl.rollout.engine`, which re-exports it) and
its per-turn steps (:mod:`tracerl.rollout.turns`) read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracerl.envs.base import DEFAULT_MAX_OBSERVATION_TOKENS, DEFAULT_MAX_TURNS

SCHEDULINGS = ("independent", "lockstep")
"""Values of :attr:`EngineConfig.vllm_scheduling` (see :mod:`tracerl.rollout.independent`)."""


@dataclass(frozen=True)
class EngineConfig:
    """Limits and sampling of one rollout engine.

    ``max_turns`` and ``max_observation_tokens`` are THE episode limits: training, evaluation and
    benchmarks build their environments from them with :func:`~tracerl.envs.base.env_config` /
    :func:`~tracerl.envs.search.search_environment`, so every path cuts episodes and
    observations alike.
    """

    max_turns: int = DEFAULT_MAX_TURNS
    """Assistant turns per episode (tool calls, invalid outputs and the answer)."""
    max_turn_tokens: int = 128
    """Tokens one assistant turn may generate."""
    max_total_tokens: int = 2048
    """Prompt + all turns; an episode that reaches it ends without an answer (reward 0)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer must use the same one for its log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_observation_tokens: int = DEFAULT_MAX_OBSERVATION_TOKENS
    """Forced tokens (policy tokenizer) after one assistant turn, markup included; a longer
    observation's text is cut at a word boundary and marked with ' ...'."""
    vllm_scheduling: str = "independent"
    """How a backend that takes requests one at a time (``vllm``) is driven: ``independent`` (one
    request per live episode, resubmitted as soon as its observation is ready: continuous
    batching across turns) or ``lockstep`` (one batched call per turn round, as ``hf`` runs by
    default). Same trajectories either way (per-request seeds; nodes numbered in lockstep order)."""
    hf_scheduling: str = "lockstep"
    """How a batch backend (``hf``) is driven: ``lockstep`` (one batched call per turn round: the
    batches, hence every log-prob bit, are the same run to run) or ``independent`` (an episode whose
    observation arrived generates its next turn without waiting for the others' tools: each call
    batches the episodes ready; same tokens, log-probs equal up to float noise across batch shapes).
    ``independent`` needs ``tool_concurrency > 0``."""
    tool_concurrency: int = 16
    """Tool calls in flight at once (calls of different episodes run concurrently; isolated tools
    get a worker process each). Results join the trees in request order, so the trees are those of
    the serial path. 0: serial, each call in turn on the driver (the path before concurrent tools)."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_observation_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature >= 0:
            raise ValueError(f"EngineConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"EngineConfig.top_p must be in (0, 1], got {self.top_p}")
        for name in ("vllm_scheduling", "hf_scheduling"):
            if getattr(self, name) not in SCHEDULINGS:
                raise ValueError(f"EngineConfig.{name} = {getattr(self, name)!r} is not valid; "
                                 f"allowed values: {', '.join(SCHEDULINGS)}")
        if not 0 <= self.tool_concurrency <= 1024:
            raise ValueError(f"EngineConfig.tool_concurrency must be in [0, 1024] (0: serial), got {self.tool_concurrency}")

