"""One global micro-batch plan for a data-parallel optimiser step (pure, plain ints).

Under FSDP every forward and backward is a collective: a rank that runs one micro-batch fewer
than the others leaves them waiting in an all-gather until the process-group timeout. So the
plan is made once, over the whole step, on the driver: the rows that carry signal are sorted by
length (less padding), cut into micro-batches, and the micro-batches are dealt round-robin to
the ranks. A rank with fewer micro-batches than the busiest one gets empty rounds, which it
runs as a zero-weight padding row: every rank runs exactly ``rounds`` forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def micro_batch_rows(lengths: Sequence[Any], keep: Sequence[bool], size: int) -> list[list[int]]:
    """Row indices of the kept rows, sorted by ``lengths`` (stable), ``size`` at a time.

    ``lengths`` and ``keep`` are per row (``[N]``); the same cut as the one-process update, so
    a plan over one rank equals its micro-batches exactly. The sort keys are usually lengths;
    the tree-packed update passes token-id tuples instead, so a tree's leaves sit together.
    """
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    if len(lengths) != len(keep):
        raise ValueError(f"lengths ({len(lengths)}) and keep ({len(keep)}) must have one entry per row")
    rows = sorted((i for i, k in enumerate(keep) if k), key=lambda i: lengths[i])
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def deal_rounds(chunks: Sequence[Sequence[int]], world: int) -> list[list[list[int]]]:
    """Deal ``chunks`` round-robin to ``world`` ranks, padded with empty rounds.

    Returns ``plan[rank][round]`` (a list of row indices, ``[]`` for a padding round); every
    rank has ``ceil(len(chunks) / world)`` rounds, so all ranks run the same number of forwards.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    rounds = -(-len(chunks) // world)
    plan: list[list[list[int]]] = [[] for _ in range(world)]
    for r in range(rounds):
        for rank in range(world):
            k = r * world + rank
            plan[rank].append(list(chunks[k]) if k < len(chunks) else [])
    return plan
