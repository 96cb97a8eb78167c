"""Root and prefix allocation (spec section 3): exact against brute force, budget, errors."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from core_reference import brute_force_roots
from hypothesis import strategies as st

from tracerl.core.allocation import (
    allocate_prefixes,
    allocate_roots,
    prefix_match_probability,
    prefix_value,
    root_value,
)

PROBS = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0.0, 1.0)


def test_root_value_hand_computed() -> None:
    assert root_value(0.5, 2) == 0.5  # 1 - 1/4 - 1/4
    assert root_value(0.1, 3) == pytest.approx(1 - 0.001 - 0.729)
    assert root_value(0.7, 1) == pytest.approx(0.0)  # one rollout is never mixed
    assert root_value(0.7, 0) == 0.0
    assert root_value(1.0, 5) == 0.0


def test_allocate_roots_hand_computed() -> None:
    # Sure prompts (v = 0 or 1) are worth nothing; the two uncertain ones share the budget.
    assert allocate_roots([1.0, 0.5, 0.0, 0.5], 8) == [0, 4, 0, 4]
    # Spreading wins strictly here: 2 x Vroot(0.5, 2) = 1.0 > Vroot(0.5, 4) = 0.875.
    assert allocate_roots([0.5, 0.5], 4) == [2, 2]
    # An exact tie, 3 x Vroot(0.5, 2) = 2 x Vroot(0.5, 3) = 1.5: earlier prompts get more.
    assert allocate_roots([0.5, 0.5, 0.5], 6) == [3, 3, 0]
    # Identical prompts and an odd budget: the earlier prompt gets the extra rollout.
    assert allocate_roots([0.5, 0.5], 5) == [3, 2]
    # A cap forces spreading; budget 0 gives zeros.
    assert allocate_roots([0.5, 0.9, 0.9], 6, max_per_prompt=2) == [2, 2, 2]
    assert allocate_roots([0.5, 0.5], 0) == [0, 0]
    assert allocate_roots([], 0) == []


@settings(deadline=None, max_examples=200)
@given(
    probs=st.lists(PROBS, max_size=4),
    budget=st.integers(0, 9),
    lo=st.integers(1, 3),
    extra=st.none() | st.integers(0, 4),
)
def test_allocate_roots_matches_brute_force(
    probs: list[float], budget: int, lo: int, extra: int | None
) -> None:
    hi = None if extra is None else lo + extra
    expected = brute_force_roots(probs, budget, lo, hi)
    if expected is None:
        with pytest.raises(ValueError, match="no allocation"):
            allocate_roots(probs, budget, min_per_prompt=lo, max_per_prompt=hi)
        return
    counts = allocate_roots(probs, budget, min_per_prompt=lo, max_per_prompt=hi)
    assert sum(counts) == budget
    assert all(c == 0 or (c >= lo and (hi is None or c <= hi)) for c in counts)
    value = sum(root_value(p, m) for p, m in zip(probs, counts, strict=True))
    assert value == pytest.approx(expected[0], abs=1e-9)
    if all(0.0 < p < 1.0 for p in probs):
        # With p in {0, 1} every allocation is worth 0 and many tie; the documented
        # tie-break is checked on non-degenerate inputs.
        assert counts == expected[1]


@pytest.mark.parametrize(
    ("probs", "budget", "kwargs", "match"),
    [
        ([0.5, 1.5], 4, {}, r"success_probs\[1\]"),
        ([-0.1], 4, {}, r"success_probs\[0\]"),
        ([float("nan")], 4, {}, "probability"),
        ([0.5, 0.5], -1, {}, "budget"),
        ([0.5, 0.5], 2.0, {}, "budget"),
        ([0.5, 0.5], 4, {"min_per_prompt": 0}, "min_per_prompt"),
        ([0.5, 0.5], 4, {"max_per_prompt": 1}, "max_per_prompt"),
        ([0.5], 3, {"max_per_prompt": 2}, "no allocation"),  # one prompt, at most 2
        ([0.5, 0.5], 1, {}, "no allocation"),  # a selected prompt needs 2
        ([0.5, 0.5], 9, {"max_per_prompt": 4}, "no allocation"),  # 2 x 4 < 9
        ([], 2, {}, "no allocation"),
    ],
)
def test_allocate_roots_errors(probs: list[float], budget: int, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        allocate_roots(probs, budget, **kwargs)


def test_prefix_match_probability_thresholds_reward() -> None:
    assert prefix_match_probability(0.8, 1.0) == 0.8  # a success continues like a success
    assert prefix_match_probability(0.8, 0.0) == pytest.approx(0.2)
    assert prefix_match_probability(0.8, 0.5) == pytest.approx(0.2)  # 0.5 is not a success
    assert prefix_match_probability(0.8, 0.6) == 0.8
    assert prefix_value(0.5, 3) == 1 - 0.125


def test_allocate_prefixes_hand_computed() -> None:
    # q = 0.5, 0.9, 0.9: gains 0.5, 0.25, 0.125, ... vs 0.1, 0.09, ...
    assert allocate_prefixes([0.5, 0.9, 0.1], [1.0, 1.0, 0.0], 5) == [3, 1, 1]
    # Equal anchors: lower index first; the cap bounds each anchor and the spend.
    assert allocate_prefixes([0.5, 0.5], [1.0, 1.0], 3) == [2, 1]
    assert allocate_prefixes([0.5, 0.5], [1.0, 1.0], 20, max_per_anchor=3) == [3, 3]
    # Certain anchors (q = 1) are worth nothing but the budget is still spent exactly;
    # with all gains equal (0) greedy keeps choosing the lowest index up to its cap.
    assert allocate_prefixes([1.0, 1.0], [1.0, 1.0], 3) == [3, 0]
    # q = 0 on anchor 1: its first continuation surely differs (gain 1), later ones add 0.
    assert allocate_prefixes([1.0, 0.0], [1.0, 1.0], 3) == [2, 1]
    assert allocate_prefixes([], [], 5) == []


def brute_force_prefixes(qs: list[float], spend: int, cap: int) -> float:
    best = -math.inf
    for counts in itertools.product(range(cap + 1), repeat=len(qs)):
        if sum(counts) == spend:
            best = max(best, sum(prefix_value(q, k) for q, k in zip(qs, counts, strict=True)))
    return best


@settings(deadline=None, max_examples=200)
@given(
    anchors=st.lists(st.tuples(PROBS, st.sampled_from([0.0, 1.0, 0.5, 0.7])), max_size=4),
    budget=st.integers(0, 14),
    cap=st.integers(1, 4),
)
def test_allocate_prefixes_matches_brute_force(
    anchors: list[tuple[float, float]], budget: int, cap: int
) -> None:
    probs = [p for p, _ in anchors]
    rewards = [r for _, r in anchors]
    counts = allocate_prefixes(probs, rewards, budget, max_per_anchor=cap)
    spend = min(budget, len(anchors) * cap)
    assert sum(counts) == spend and all(0 <= c <= cap for c in counts)
    qs = [prefix_match_probability(p, r) for p, r in anchors]
    value = sum(prefix_value(q, k) for q, k in zip(qs, counts, strict=True))
    assert value == pytest.approx(brute_force_prefixes(qs, spend, cap), abs=1e-9)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0.5], [1.0, 0.0], 2), {}, "observed_rewards has 2"),
        (([1.5], [1.0], 2), {}, r"success_probs\[0\]"),
        (([0.5], [float("nan")], 2), {}, r"observed_rewards\[0\]"),
        (([0.5], [2.0], 2), {}, r"observed_rewards\[0\]"),
        (([0.5], [1.0], -1), {}, "budget"),
        (([0.5], [1.0], 2), {"max_per_anchor": 0}, "max_per_anchor"),
    ],
)
def test_allocate_prefixes_errors(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        allocate_prefixes(*args, **kwargs)


def test_root_value_errors() -> None:
    with pytest.raises(ValueError, match="v"):
        root_value(1.2, 2)
    with pytest.raises(ValueError, match="m must be"):
        root_value(0.5, -1)
