"""Divergence tests over a run's per-step metrics: pure functions of plain floats.

A diverged run rarely turns its weights into NaN. At a learning rate of 1e30 the tiny model's
weights stay finite while the policy becomes noise after one update: the sampled tokens'
entropy jumps to that of the uniform distribution, no action parses any more and the reward
falls to zero and stays there, while the loss and gradient norm drop to exactly 0 (every
advantage is 0). Other collapses show as a loss, gradient norm or KL jumping by orders of
magnitude. Each test compares the current step with the steps before it, so a policy that was
noise from the start (a randomly initialised smoke model) is never flagged; the trainer's
:class:`~tracerl.runs.divergence.DivergenceMonitor` keeps the history and decides warn or stop.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def jump_ratio(history: Sequence[float], value: float, floor: float) -> float:
    """``|value|`` over the running baseline ``max(median |history|, floor)``.

    The median ignores single spikes of the baseline; ``floor`` keeps a metric that sits near 0
    (a GRPO loss) from turning noise into large ratios. Empty history: 0 (nothing to compare).
    """
    if not history or not math.isfinite(value):
        return 0.0
    baseline = max(statistics.median(abs(h) for h in history), floor)
    return abs(value) / baseline


def entropy_rose_to_uniform(history: Sequence[float], value: float, uniform: float, share: float) -> bool:
    """Whether the sampled tokens' entropy (nats) reached ``share`` of the uniform distribution's
    ``uniform = ln(vocabulary)`` while the median before was below half of that level."""
    if not history or not math.isfinite(value) or uniform <= 0:
        return False
    level = share * uniform
    return value >= level and statistics.median(history) < level / 2


def collapsed_to_zero(history: Sequence[float], patience: int, min_level: float) -> bool:
    """Whether the last ``patience`` values are all 0 while the values before them averaged at
    least ``min_level`` (a rate that was alive and died, not one that never lived)."""
    if patience < 1 or len(history) <= patience:
        return False
    before, last = history[:-patience], history[-patience:]
    return all(v <= 0 for v in last) and statistics.fmean(before) >= min_level


def blow_up_onset(series: Sequence[float], factor: float, patience: int, warmup: int, window: int) -> int | None:
    """Index in ``series`` where a blow-up began, when the last ``patience`` values all reached
    ``factor`` times the median of the up to ``window`` values before that streak; else None.

    Made for the generated tokens per rollout: a policy that starts padding its turns with junk
    (tokens that do not change the parsed action, so no reward tells against them) grows its
    generations by an order of magnitude in a few steps, long before the reward falls to 0 or
    the valid-action rate does. The streak must last ``patience`` steps (one long step is noise)
    and the baseline needs ``warmup`` values; the median ignores single long steps in it.
    """
    if patience < 1 or factor <= 1 or len(series) < warmup + patience:
        return None
    onset = len(series) - patience
    before = series[max(0, onset - window):onset]
    if len(before) < warmup:
        return None
    level = factor * statistics.median(before)
    if level <= 0 or not all(math.isfinite(v) and v >= level for v in series[onset:]):
        return None
    return onset
