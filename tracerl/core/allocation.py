"""Budget allocation math of TRACE allocation (spec section 3): pure functions, no model.

* Stage 1, roots: give prompt i ``m_i`` rollouts to maximise the expected number of mixed
  groups ``sum_i Vroot(v_i, m_i)``, ``Vroot(v, m) = 1 - v^m - (1-v)^m``. Because a selected
  prompt needs at least ``min_per_prompt`` rollouts (one rollout alone is worth nothing),
  one-at-a-time greedy is not optimal; :func:`allocate_roots` solves it exactly with a DP
  over prompts x budget.
* Stage 2, prefixes: give anchor a ``k_a`` continuations to maximise ``sum_a 1 - q_a^k_a``
  with ``q`` the chance a continuation ends like the observed rollout. Marginal gains
  ``q^(k-1) (1-q)`` shrink with k, so greedy by marginal gain is optimal
  (:func:`allocate_prefixes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TIE_TOLERANCE = 1e-12
"""Objective values closer than this count as ties (then the deterministic rule decides)."""


def _check_probs(name: str, probs: Sequence[float]) -> list[float]:
    out = [float(p) for p in probs]
    for i, p in enumerate(out):
        if not math.isfinite(p) or not 0.0 <= p <= 1.0:
            raise ValueError(f"{name}[{i}] = {p!r} is not a probability in [0, 1]")
    return out


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def root_value(v: float, m: int) -> float:
    """``Vroot(v, m) = 1 - v^m - (1-v)^m``: probability that m rollouts mix success/failure.

    ``m = 0`` returns 0 (no rollouts, no mixed group); the closed form would give -1 there
    because "all succeed" and "all fail" are then the same empty event, counted twice.
    """
    _check_probs("v", [v])
    m = _check_count("m", m, 0)
    if m == 0:
        return 0.0
    return 1.0 - v**m - (1.0 - v) ** m


def prefix_match_probability(success_prob: float, observed_reward: float) -> float:
    """``q = r p + (1-r)(1-p)`` with ``r`` thresholded at 0.5 (success means ``r > 0.5``)."""
    r = 1.0 if observed_reward > 0.5 else 0.0
    return r * success_prob + (1.0 - r) * (1.0 - success_prob)


def prefix_value(q: float, k: int) -> float:
    """``Vpref = 1 - q^k``: probability at least one of k continuations ends differently."""
    return 1.0 - q**k


def _root_options(budget: int, lo: int, hi: int, floor: int = 0) -> list[int]:
    """Counts a prompt may get, most first (so the reconstruction prefers earlier prompts):
    ``floor`` itself, or a selected prompt's ``[max(lo, floor), hi]``."""
    return [m for m in range(min(hi, budget), max(lo, floor) - 1, -1)] + ([floor] if floor < lo else [])


def allocate_roots(
    success_probs: Sequence[float],
    budget: int,
    *,
    min_per_prompt: int = 2,
    max_per_prompt: int | None = None,
    floor_per_prompt: int = 0,
) -> list[int]:
    """Stage-1 rollouts per prompt: exact maximiser of ``sum_i root_value(v_i, m_i)``.

    Each count is ``floor_per_prompt`` (the spec's ``m_min``, default 0: a prompt may be skipped)
    or in ``[max(min_per_prompt, floor), max_per_prompt]`` (no upper cap when None) and the
    counts sum to ``budget`` exactly. Dynamic programme over (prompt, budget left):
    ``O(n * budget * options)`` with the budget axis vectorised.

    Tie-break (deterministic): among allocations within ``1e-12`` of the optimum, the
    lexicographically largest count vector wins, i.e. earlier prompts get more (spec:
    "ties break by prompt order").

    Raises:
        ValueError: a probability outside [0, 1] or non-finite, a negative budget,
            ``min_per_prompt < 1``, ``max_per_prompt < min_per_prompt``, or no allocation
            with these bounds sums to ``budget``.
    """
    probs = _check_probs("success_probs", success_probs)
    budget = _check_count("budget", budget, 0)
    lo = _check_count("min_per_prompt", min_per_prompt, 1)
    hi = budget if max_per_prompt is None else _check_count("max_per_prompt", max_per_prompt, 1)
    if max_per_prompt is not None and hi < lo:
        raise ValueError(f"max_per_prompt ({hi}) must be >= min_per_prompt ({lo})")
    floor = _check_count("floor_per_prompt", floor_per_prompt, 0)
    if max_per_prompt is not None and hi < floor:
        raise ValueError(f"max_per_prompt ({hi}) must be >= floor_per_prompt ({floor})")
    n = len(probs)
    options = _root_options(budget, lo, hi, floor)
    gains = [[root_value(p, m) for m in options] for p in probs]
    # best[i][b]: best value of prompts i..n-1 spending exactly b (-inf when impossible).
    best = np.full((n + 1, budget + 1), -np.inf)
    best[n, 0] = 0.0
    for i in range(n - 1, -1, -1):
        for m, gain in zip(options, gains[i], strict=True):
            cand = best[i + 1, : budget + 1 - m] + gain
            np.maximum(best[i, m:], cand, out=best[i, m:])
    if not np.isfinite(best[0, budget]):
        raise ValueError(
            f"no allocation of budget {budget} over {n} prompts with counts {floor} or in "
            f"[{lo}, {max_per_prompt if max_per_prompt is not None else 'budget'}]"
        )
    counts, left = [], budget
    for i in range(n):
        for m, gain in zip(options, gains[i], strict=True):
            if m > left or not np.isfinite(best[i + 1, left - m]):
                continue
            if gain + best[i + 1, left - m] >= best[i, left] - TIE_TOLERANCE:
                counts.append(m)
                left -= m
                break
    return counts


def exploration_prompts(candidates: int, rollouts: int, group: int, seed: int) -> list[int]:
    """Indices of the prompts stage 1 explores: ``min(candidates, rollouts // group)`` drawn
    uniformly without replacement (seeded), sorted; each is given ``group`` rollouts.

    Why: stage 1's predictor is trained only on the prompts it chose, so a prompt class it
    over- or under-estimates is never corrected; rollouts on uniformly drawn prompts give it an
    unbiased sample of the pool (the exploration share of ``trace_explore_fraction``).
    """
    candidates = _check_count("candidates", candidates, 0)
    group = _check_count("group", group, 1)
    n = min(candidates, _check_count("rollouts", rollouts, 0) // group)
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(candidates, size=n, replace=False)) if n else []


def allocate_prefixes(
    success_probs: Sequence[float],
    observed_rewards: Sequence[float],
    budget: int,
    *,
    max_per_anchor: int = 4,
) -> list[int]:
    """Stage-2 continuations per anchor, greedy by marginal gain ``q^(k-1) (1-q)``.

    ``q_a`` is :func:`prefix_match_probability` of the anchor's predicted success and its
    rollout's observed reward. Spends ``min(budget, anchors * max_per_anchor)`` exactly;
    equal gains go to the lower anchor index first. Optimal because each anchor's gains are
    non-increasing in k.
    """
    probs = _check_probs("success_probs", success_probs)
    rewards = [float(r) for r in observed_rewards]
    if len(rewards) != len(probs):
        raise ValueError(
            f"observed_rewards has {len(rewards)} entries, success_probs has {len(probs)}"
        )
    for i, r in enumerate(rewards):
        if not math.isfinite(r) or not 0.0 <= r <= 1.0:
            raise ValueError(f"observed_rewards[{i}] = {r!r} is not a reward in [0, 1]")
    budget = _check_count("budget", budget, 0)
    cap = _check_count("max_per_anchor", max_per_anchor, 1)
    qs = [prefix_match_probability(p, r) for p, r in zip(probs, rewards, strict=True)]
    # All (anchor, k) slots sorted by gain, then anchor, then k: gains fall with k, so the
    # top slots form a prefix 1..k_a per anchor, which is exactly the greedy allocation.
    slots = sorted(
        ((-(q ** (k - 1)) * (1.0 - q), a, k) for a, q in enumerate(qs) for k in range(1, cap + 1)),
    )
    counts = [0] * len(qs)
    for _, a, _ in slots[: min(budget, len(slots))]:
        counts[a] += 1
    return counts
