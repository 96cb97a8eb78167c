"""The divergence tests by hand (tracerl/core/divergence.py)."""

from __future__ import annotations

import math

from tracerl.core.divergence import collapsed_to_zero, entropy_rose_to_uniform, jump_ratio


def test_jump_ratio_is_the_value_over_the_running_median_or_the_floor() -> None:
    assert jump_ratio([1.0, 2.0, 100.0], 2000.0, floor=0.01) == 1000.0  # median 2: the spike 100 is ignored
    assert jump_ratio([1.0, -3.0], -4.0, floor=0.01) == 2.0  # magnitudes: median of 1 and 3
    assert jump_ratio([0.0, 0.0, 0.0], 5.0, floor=0.01) == 500.0  # a baseline of 0 is the floor
    assert jump_ratio([], 5.0, floor=1.0) == 0.0
    assert jump_ratio([1.0], math.nan, floor=1.0) == 0.0  # NaN is the non-finite guard's, not this one's


def test_entropy_rising_to_uniform_needs_a_lower_past() -> None:
    uniform = math.log(400)  # 5.99 nats; 0.9 of it is 5.39
    assert entropy_rose_to_uniform([0.4, 0.5], 5.5, uniform, share=0.9)
    assert not entropy_rose_to_uniform([0.4, 0.5], 5.3, uniform, share=0.9)  # below 0.9 of uniform
    assert not entropy_rose_to_uniform([5.9, 6.0], 6.0, uniform, share=0.9)  # noise from the start (random init)
    assert not entropy_rose_to_uniform([], 6.0, uniform, share=0.9)


def test_collapse_to_zero_needs_a_live_past_and_patience() -> None:
    assert collapsed_to_zero([1.0, 0.5, 0.0, 0.0, 0.0], patience=3, min_level=0.1)
    assert not collapsed_to_zero([1.0, 0.0, 0.0], patience=3, min_level=0.1)  # no step before the zeros
    assert not collapsed_to_zero([0.05, 0.0, 0.0, 0.0], patience=3, min_level=0.1)  # never really lived
    assert not collapsed_to_zero([1.0, 0.0, 0.2, 0.0], patience=3, min_level=0.1)  # came back once
    assert not collapsed_to_zero([1.0, 0.0], patience=0, min_level=0.1)  # switched off
