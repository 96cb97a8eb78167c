"""The global micro-batch plan: every rank runs the same number of rounds; one rank equals today's cut."""

from __future__ import annotations

import pytest

from tracerl.core.microbatch import deal_rounds, micro_batch_rows


def test_rows_sorted_by_length_and_cut() -> None:
    lengths = [30, 10, 20, 40, 10]
    keep = [True, True, False, True, True]
    # kept: 0 (30), 1 (10), 3 (40), 4 (10); stable by length: 1, 4, 0, 3
    assert micro_batch_rows(lengths, keep, 2) == [[1, 4], [0, 3]]
    assert micro_batch_rows(lengths, keep, 3) == [[1, 4, 0], [3]]
    assert micro_batch_rows(lengths, [False] * 5, 2) == []


def test_deal_pads_short_ranks_with_empty_rounds() -> None:
    chunks = [[1, 4], [0, 3], [2]]
    assert deal_rounds(chunks, 2) == [[[1, 4], [2]], [[0, 3], []]]
    assert deal_rounds(chunks, 1) == [[[1, 4], [0, 3], [2]]]
    # one micro-batch, four ranks: three ranks hold only a padding round, and all run one round
    assert deal_rounds([[5]], 4) == [[[5]], [[]], [[]], [[]]]
    assert deal_rounds([], 3) == [[], [], []]


def test_every_row_lands_once() -> None:
    chunks = micro_batch_rows(list(range(11, 0, -1)), [i % 3 != 0 for i in range(11)], 2)
    plan = deal_rounds(chunks, 3)
    assert len({len(rounds) for rounds in plan}) == 1
    dealt = sorted(i for rounds in plan for chunk in rounds for i in chunk)
    assert dealt == [i for i in range(11) if i % 3 != 0]


def test_bad_sizes_are_named() -> None:
    with pytest.raises(ValueError, match="micro-batch size"):
        micro_batch_rows([1], [True], 0)
    with pytest.raises(ValueError, match="world size"):
        deal_rounds([[0]], 0)
    with pytest.raises(ValueError, match="one entry per row"):
        micro_batch_rows([1, 2], [True], 1)
