"""Placement of tasks' trees on rollout workers by planned work (tracerl.rollout.placement)."""

from __future__ import annotations

import random

import pytest

from tracerl.core.protocol import worker_of
from tracerl.rollout.placement import imbalance, in_request_order, place


def test_largest_first_to_the_least_loaded_worker() -> None:
    # LPT by hand on 2 workers: a5 -> w0 (0,0: lowest index); b4 -> w1; c3 -> w1 (4 < 5) = 7;
    # d3 -> w0 (5 < 7) = 8; e2 -> w1 (7 < 8) = 9; f1 -> w0 (8 < 9) = 9
    work = [("f", 1), ("c", 3), ("a", 5), ("e", 2), ("b", 4), ("d", 3)]
    assert place(work, [0.0, 0.0]) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1, "f": 0}


def test_loads_so_far_count_and_are_not_changed() -> None:
    loads = [6.0, 0.0, 2.0]
    assert place([("x", 4), ("y", 4)], loads) == {"x": 1, "y": 2}  # x: w1 0 -> 4; y: w2 2 -> 6
    assert loads == [6.0, 0.0, 2.0]


def test_a_tie_prefers_the_worker_that_prefilled_the_prompt() -> None:
    assert place([("x", 2)], [1.0, 1.0, 1.0], prefer={"x": 2}) == {"x": 2}
    assert place([("x", 2)], [1.0, 0.0, 1.0], prefer={"x": 2}) == {"x": 1}  # never at the cost of balance


def test_imbalance_is_busiest_over_mean() -> None:
    assert imbalance([3.0, 1.0]) == pytest.approx(1.5)
    assert imbalance([8.0, 0.0, 0.0, 0.0]) == pytest.approx(4.0)
    assert imbalance([0.0, 0.0]) == 1.0


def _loads(assignment: dict[str, int], work: list[tuple[str, float]], workers: int) -> list[float]:
    loads = [0.0] * workers
    for task, amount in work:
        loads[assignment[task]] += amount
    return loads


@pytest.mark.parametrize("seed", range(5))
def test_eight_workers_and_sixteen_prompts_stay_within_1_25x(seed: int) -> None:
    """16 prompts of 1-16 planned rollouts each (allocation gives prompts unequal shares) on 8
    workers: busiest / mean <= 1.25, where the task-id hash placement is far worse."""
    rng = random.Random(seed)
    work = [(f"task-{seed}-{i}", float(rng.randint(1, 16))) for i in range(16)]
    balanced = imbalance(_loads(place(work, [0.0] * 8), work, 8))
    hashed = imbalance(_loads({t: worker_of(t, 8) for t, _ in work}, work, 8))
    assert balanced <= 1.25 < hashed, (balanced, hashed)


def test_equal_work_spreads_evenly() -> None:
    work = [(f"t{i}", 8.0) for i in range(16)]  # GRPO: every prompt the same group size
    assert _loads(place(work, [0.0] * 8), work, 8) == [16.0] * 8


def test_answers_of_several_workers_come_back_in_request_order() -> None:
    # requests 0..4 split over workers 1 (0, 3) and 0 (1, 2, 4); each answers in its own order
    shares = {1: [0, 3], 0: [1, 2, 4]}
    answers = {1: ["a0", "a3"], 0: ["b1", "b2", "b4"]}
    assert in_request_order(shares, answers, 5) == ["a0", "b1", "b2", "a3", "b4"]
    with pytest.raises(ValueError):  # a worker that answered fewer requests than it was given
        in_request_order(shares, {1: ["a0"], 0: ["b1", "b2", "b4"]}, 5)
