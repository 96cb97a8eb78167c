"""Stage-1 options beside the paper's (spec section 3): the floor m_min on every prompt and the
exploration draw. Exact against brute force on small cases, as the paper's stage 1 is."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from core_reference import brute_force_roots
from hypothesis import strategies as st

from tracerl.core.allocation import allocate_roots, exploration_prompts, root_value

PROBS = st.sampled_from([0.1, 0.3, 0.5, 0.8]) | st.floats(0.01, 0.99)


def test_floor_hand_computed() -> None:
    # The paper's stage 1 skips the sure prompt; a floor of 2 gives it a pair anyway.
    assert allocate_roots([0.5, 0.99], 8, min_per_prompt=2) == [8, 0]
    assert allocate_roots([0.5, 0.99], 8, min_per_prompt=2, floor_per_prompt=2) == [6, 2]
    # Floor 1 below a selected minimum of 4: counts are 1 or >= 4.
    assert allocate_roots([0.5, 0.5, 0.99], 9, min_per_prompt=4, floor_per_prompt=1) == [4, 4, 1]
    with pytest.raises(ValueError, match="no allocation"):
        allocate_roots([0.5, 0.5, 0.5], 5, floor_per_prompt=2)  # 3 prompts x 2 > 5
    with pytest.raises(ValueError, match="floor_per_prompt"):
        allocate_roots([0.5], 4, floor_per_prompt=3, max_per_prompt=2)


@settings(deadline=None, max_examples=200)
@given(probs=st.lists(PROBS, min_size=1, max_size=4), budget=st.integers(0, 10), lo=st.integers(1, 3),
       floor=st.integers(0, 3), extra=st.none() | st.integers(0, 3))
def test_floor_matches_brute_force(probs: list[float], budget: int, lo: int, floor: int, extra: int | None) -> None:
    hi = None if extra is None else max(lo, floor) + extra
    expected = brute_force_roots(probs, budget, lo, hi, floor)
    kwargs = {"min_per_prompt": lo, "max_per_prompt": hi, "floor_per_prompt": floor}
    if expected is None:
        with pytest.raises(ValueError, match="no allocation"):
            allocate_roots(probs, budget, **kwargs)
        return
    counts = allocate_roots(probs, budget, **kwargs)
    assert sum(counts) == budget and all(c >= floor for c in counts)
    assert sum(root_value(p, m) for p, m in zip(probs, counts, strict=True)) == pytest.approx(expected[0], abs=1e-9)
    assert counts == expected[1]


def test_exploration_draw_is_seeded_uniform_and_bounded() -> None:
    assert exploration_prompts(16, 8, 4, seed=3) == exploration_prompts(16, 8, 4, seed=3)
    assert len(exploration_prompts(16, 9, 4, seed=0)) == 2  # 9 // 4 groups
    assert exploration_prompts(2, 40, 4, seed=0) == [0, 1]  # never more prompts than candidates
    assert exploration_prompts(16, 3, 4, seed=0) == []
    # uniform: over many seeds every prompt is drawn about equally often (2 of 8 per draw)
    hits = [0] * 8
    for seed in range(4000):
        for i in exploration_prompts(8, 4, 2, seed):
            hits[i] += 1
    assert all(abs(h / 4000 - 0.25) < 0.03 for h in hits)
