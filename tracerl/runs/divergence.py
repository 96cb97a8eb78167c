"""Divergence detection: warn or stop when training collapses while the weights stay finite.

Each step the trainer adds two signals of its rollouts to the step's record
(:func:`step_signals`) and hands the record to :class:`DivergenceMonitor`, which runs the tests
of :mod:`tracerl.core.divergence` against the previous steps (checkpointed, so a resumed run
decides as an uninterrupted one):

- the loss, gradient norm or KL jumping to ``jump_factor`` times its running median;
- the sampled tokens' entropy rising to ``entropy_share`` of the uniform distribution's;
- the valid-action rate falling to 0 and staying there ``collapse_steps`` steps, with no reward;
- the generated tokens per rollout staying ``length_factor`` times their running median for
  ``length_steps`` steps (a length blow-up: the demo's policy padded its turns with junk that
  the action parser skips, from ~2k to 44k tokens a step, before its reward fell to 0).

``optim.divergence.mode``: ``warn`` (default: one line on stderr per kind of divergence, training
goes on), ``stop`` (the run ends with that line, exit 1; the diverged step is not checkpointed),
``rollback`` (:class:`DivergenceRollback`: the trainer restores the newest checkpoint written
before the divergence began and ends the run there; runs/rollback.py) or ``off``. Warn is the
default because a collapse can be a result worth measuring (the credit sweep's benchmarks record
runs that collapsed); set ``stop`` or ``rollback`` for runs nobody watches (the demo rolls back).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tracerl.config.divergence import DivergenceConfig
from tracerl.core.divergence import blow_up_onset, collapsed_to_zero, entropy_rose_to_uniform, jump_ratio
from tracerl.core.types import Trajectory
from tracerl.errors import UserError

JUMP_FLOORS = {"loss": 1e-2, "grad_norm": 1e-2, "kl": 1e-2}
"""Metrics tested for jumps, with the baseline floor of each (a value near 0 is not a baseline)."""


class DivergenceError(UserError):
    """Training diverged (see the message for which test fired); the run stops."""


class DivergenceRollback(DivergenceError):
    """``mode=rollback``: training diverged; ``onset`` is the first step whose rollouts showed it,
    so the weights after update ``onset - 1`` already drifted and checkpoints before it are good."""

    def __init__(self, message: str, onset: int) -> None:
        super().__init__(message)
        self.onset = onset


def tokens_per_rollout(record: dict[str, Any]) -> float | None:
    """Generated tokens per rollout of a step record (None without rollouts)."""
    tokens, rollouts = _number(record.get("generated_tokens")), _number(record.get("rollouts"))
    return tokens / rollouts if tokens is not None and rollouts else None


def step_signals(trajectories: list[Trajectory]) -> dict[str, float | None]:
    """``valid_action_rate``: share of the turns of valid trajectories whose action parsed and was
    accepted; ``sampled_entropy``: mean negative sampling log-prob of their sampled tokens (nats,
    a Monte-Carlo estimate of the sampling distribution's entropy). None without turns/tokens."""
    turns = [turn for t in trajectories if not t.infra_failed for turn in t.turns]
    logprobs = [lp for turn in turns for lp in turn.logprobs]
    rate = float(np.mean([turn.action.kind != "invalid" and not turn.tool_error for turn in turns])) if turns else None
    return {"valid_action_rate": rate, "sampled_entropy": -float(np.mean(logprobs)) if logprobs else None}


class DivergenceMonitor:
    """Keeps the recent history of the watched metrics and runs the divergence tests each step."""

    def __init__(self, config: DivergenceConfig, vocab_size: int) -> None:
        self.config, self.uniform = config, math.log(vocab_size) if vocab_size > 1 else 0.0
        self.history: dict[str, list[float]] = {}
        self.warned: list[str] = []
        """Kinds of divergence already warned about (``warn`` prints each once)."""

    def observe(self, record: dict[str, Any], last_good: Callable[[], str]) -> None:
        """Test the step ``record``, then add it to the history. Stop mode raises
        :class:`DivergenceError`; warn mode prints one line per kind."""
        if self.config.mode == "off":
            return
        found = self._test(record)
        self._remember(record)
        if found is None:
            return
        kind, why, back = found
        step = int(record.get("step", 0))
        message = f"training diverged at step {step}: {why}"
        if self.config.mode == "rollback":
            raise DivergenceRollback(message, step - back)
        if self.config.mode == "stop":  # the step's rollouts came from the weights of the update before
            raise DivergenceError(f"{message}. {last_good()} (checkpoints from step {max(step - 1, 0)} on may hold "
                                  "the diverged policy); lower optim.lr, or set optim.divergence.mode=warn to train on")
        if kind not in self.warned:
            self.warned.append(kind)
            print(f"warning: {message} (optim.divergence.mode=warn: training goes on)", file=sys.stderr, flush=True)

    def _test(self, record: dict[str, Any]) -> tuple[str, str, int] | None:
        """The first test that fires: its kind, why, and how many steps before this one it began."""
        cfg, history = self.config, self.history
        for name, floor in JUMP_FLOORS.items():
            past, value = history.get(name, [])[-cfg.window:], _number(record.get(name))
            if value is not None and len(past) >= cfg.warmup:
                ratio = jump_ratio(past, value, floor)
                if ratio >= cfg.jump_factor:
                    return name, (f"{name} = {value:.3g} is {ratio:.3g}x its running median over the last "
                                  f"{len(past)} steps (optim.divergence.jump_factor = {cfg.jump_factor:g})"), 0
        entropy, past = _number(record.get("sampled_entropy")), history.get("sampled_entropy", [])[-cfg.window:]
        if cfg.entropy_share > 0 and entropy is not None and entropy_rose_to_uniform(
                past, entropy, self.uniform, cfg.entropy_share):
            return "entropy", (f"the sampled tokens' entropy rose to {entropy:.3g} nats, {entropy / self.uniform:.0%} "
                               f"of the uniform distribution's (optim.divergence.entropy_share = "
                               f"{cfg.entropy_share:g}): the policy samples noise"), 0
        return self._length(record) or self._collapse(record)

    def _length(self, record: dict[str, Any]) -> tuple[str, str, int] | None:
        cfg, value = self.config, tokens_per_rollout(record)
        if cfg.length_factor == 0 or value is None:
            return None
        series = [*self.history.get("tokens_per_rollout", [])[-(cfg.window + cfg.length_steps):], value]
        onset = blow_up_onset(series, cfg.length_factor, cfg.length_steps, cfg.warmup, cfg.window)
        if onset is None:
            return None
        before = float(np.median(series[max(0, onset - cfg.window):onset]))
        back = len(series) - 1 - onset
        return "length", (f"the generations grew to {value:.0f} tokens a rollout, {value / before:.1f}x their running "
                          f"median of {before:.0f}, for {cfg.length_steps} steps (optim.divergence.length_factor = "
                          f"{cfg.length_factor:g}, length_steps = {cfg.length_steps})"), back

    def _collapse(self, record: dict[str, Any]) -> tuple[str, str, int] | None:
        cfg = self.config
        rate, reward = _number(record.get("valid_action_rate")), _number(record.get("reward_mean"))
        if cfg.collapse_steps == 0 or rate is None or reward is None:
            return None
        rates = [*self.history.get("valid_action_rate", [])[-cfg.window:], rate]
        rewards = [*self.history.get("reward_mean", []), reward][-cfg.collapse_steps:]
        if collapsed_to_zero(rates, cfg.collapse_steps, cfg.collapse_min_rate) and all(r <= 0 for r in rewards):
            before = float(np.mean(rates[:-cfg.collapse_steps]))
            return "collapse", (f"no action was valid and no reward was earned for {cfg.collapse_steps} steps "
                                f"(valid-action rate before: {before:.2f}; optim.divergence.collapse_steps = "
                                f"{cfg.collapse_steps})"), cfg.collapse_steps - 1
        return None

    def _remember(self, record: dict[str, Any]) -> None:
        keep = self.config.window + max(self.config.collapse_steps, self.config.length_steps)
        values = {name: _number(record.get(name))
                  for name in (*JUMP_FLOORS, "sampled_entropy", "valid_action_rate", "reward_mean")}
        values["tokens_per_rollout"] = tokens_per_rollout(record)
        for name, value in values.items():
            if value is not None:
                self.history[name] = [*self.history.get(name, []), value][-keep:]

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()}, "warned": list(self.warned)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {str(k): [float(x) for x in v] for k, v in state.get("history", {}).items()}
        self.warned = [str(k) for k in state.get("warned", [])]


def _number(value: Any) -> float | None:
    """A finite float of a record value, else None (non-finite steps are the NaN guard's)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
