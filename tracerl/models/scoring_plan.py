"""Planning of batched reference scoring (pure Python, no torch): which prefixes to prefill
in which rows, which cuts to score, and how to group rows into bounded batches.

See :mod:`tracerl.models.batched_scoring` for the algorithm; this module decides *what* runs,
that one runs it on the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScoreRequest:
    """One trajectory's scoring job: ``l`` at each cut of ``input_ids`` for ``opener + answer``.

    ``input_ids`` holds at least ``max(cut_points)`` tokens; cuts lie in ``[1, len(input_ids)]``.
    """

    input_ids: tuple[int, ...]
    cut_points: tuple[int, ...]
    answer_ids: tuple[int, ...]
    opener_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cut:
    row: int
    anchor: int  # row slot of the last prefix token the block sees (-1: none)
    visible: int  # prefix length the block sees: the position of its first token
    lead: tuple[int, ...]
    answer: tuple[int, ...]

    @property
    def block(self) -> tuple[int, ...]:
        return self.lead + self.answer[:-1]


@dataclass
class Row:
    """A prefill row: sequences sharing prefixes packed as a token trie in depth-first order.

    Token ``k`` is an ancestor-or-self of token ``p`` iff ``k <= p < end[k]``, so one ``end``
    list encodes the whole tree attention pattern; ``depth`` is each token's position id.
    """

    tokens: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    members: int = 0


def validate_request(req: ScoreRequest) -> None:
    if not req.answer_ids:
        raise ValueError("ScoreRequest.answer_ids must not be empty")
    if not req.cut_points:
        raise ValueError("ScoreRequest.cut_points must not be empty")
    bad = [c for c in req.cut_points if not 1 <= c <= len(req.input_ids)]
    if bad:
        raise ValueError(f"ScoreRequest.cut_points must lie in [1, {len(req.input_ids)}] (len(input_ids)); got {bad}")


def _maximal(seqs: Sequence[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], dict[tuple[int, ...], int]]:
    """Distinct maximal sequences in lexicographic order and the one covering each sequence.

    In lexicographic order a sequence that is a prefix of any other is a prefix of its successor,
    so one backward pass folds every such sequence into its successor's cover.
    """
    order = sorted(set(seqs))
    kept: list[tuple[int, ...]] = []
    cover: dict[tuple[int, ...], tuple[int, ...]] = {}
    for i in reversed(range(len(order))):
        s = order[i]
        if i + 1 < len(order) and order[i + 1][: len(s)] == s:
            cover[s] = cover[order[i + 1]]
        else:
            cover[s] = s
            kept.append(s)
    kept.reverse()
    index = {s: i for i, s in enumerate(kept)}
    return kept, {s: index[c] for s, c in cover.items()}


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # the common prefix of two sequences of any lengths
        if x != y:
            break
        n += 1
    return n


def _pack(kept: Sequence[tuple[int, ...]], row_cap: int,
          quadratic: bool = False) -> tuple[list[Row], list[tuple[int, list[int]]]]:
    """Pack sorted maximal sequences into trie rows of at most ``row_cap`` tokens (a longer
    sequence gets a row of its own). Returns the rows and, per sequence, (row, slot per token).
    ``quadratic``: a row also stops growing once its length squared would pass the sum of its
    members' squared lengths, so a row's dense attention never costs more than its sequences'
    own (a whole batch's trees in one row would, though it forwards fewer tokens).

    In sorted order a sequence shares its longest prefix with its predecessor, so appending its
    new tokens after the row's last token keeps the row in depth-first order."""
    rows: list[Row] = []
    placed: list[tuple[int, list[int]]] = []
    prev: tuple[int, ...] = ()
    prev_slots: list[int] = []
    squares = 0  # sum of the current row's members' squared lengths
    for seq in kept:
        shared = _common(prev, seq)
        grown = len(rows[-1].tokens) + len(seq) - shared if rows else 0
        if not rows or shared == 0 or grown > row_cap or (quadratic and grown**2 > squares + len(seq) ** 2):
            rows.append(Row())
            shared, squares = 0, 0
        squares += len(seq) ** 2
        row, base = rows[-1], len(rows[-1].tokens)
        slots = prev_slots[:shared] + list(range(base, base + len(seq) - shared))
        row.tokens += seq[shared:]
        row.depth += range(shared, len(seq))
        row.end += [0] * (len(seq) - shared)
        for k in slots:  # every token on this path now ends its subtree after the new tokens
            row.end[k] = len(row.tokens)
        row.members += 1
        placed.append((len(rows) - 1, slots))
        prev, prev_slots = seq, slots
    return rows, placed


def trie_rows(seqs: Sequence[Sequence[int]], row_cap: int,
              quadratic: bool = False) -> tuple[list[Row], list[tuple[int, list[int]]]]:
    """Token sequences packed as trie rows (each shared prefix once, depth-first, at most
    ``row_cap`` tokens a row unless one sequence is longer; ``quadratic``: see :func:`_pack`), and
    per input sequence its ``(row, slot of each token)``. Equal sequences, and a sequence that is a
    prefix of another, share the other's slots. The tree-packed update lays out trees this way."""
    if row_cap < 1:
        raise ValueError(f"row_cap must be >= 1, got {row_cap}")
    as_tuples = [tuple(s) for s in seqs]
    kept, cover = _maximal(as_tuples)
    rows, placed = _pack(kept, row_cap, quadratic)
    return rows, [(placed[cover[s]][0], placed[cover[s]][1][: len(s)]) for s in as_tuples]


def plan_requests(requests: Sequence[ScoreRequest], row_cap: int) -> tuple[list[Row], list[Cut], list[list[int]]]:
    """Rows, unique cuts, and for each request the unique-cut index of each of its cuts."""
    seqs = [tuple(r.input_ids[: max(r.cut_points)]) for r in requests]
    kept, cover = _maximal(seqs)
    rows, placed = _pack(kept, row_cap)
    index: dict[tuple[Any, ...], int] = {}
    cuts: list[Cut] = []
    where: list[list[int]] = []
    for req, seq in zip(requests, seqs, strict=True):
        opener, answer, mine = tuple(req.opener_ids), tuple(req.answer_ids), []
        row, slots = placed[cover[seq]]
        for c in req.cut_points:
            key = (opener, answer, seq[:c])
            if key not in index:
                index[key] = len(cuts)
                lead, visible = (opener, c) if opener else ((seq[c - 1],), c - 1)
                cuts.append(Cut(row, slots[visible - 1] if visible else -1, visible, lead, answer))
            mine.append(index[key])
        where.append(mine)
    return rows, cuts, where


def group_batches(lengths: dict[int, int], widths: dict[int, int], cap: int) -> list[list[int]]:
    """Rows grouped by length so that rows x (longest row + longest block run) <= ``cap``."""
    batches: list[list[int]] = []
    current: list[int] = []
    long_row = wide = 0
    for row in sorted(lengths, key=lambda r: (lengths[r], r)):
        new_long, new_wide = max(long_row, lengths[row]), max(wide, widths[row])
        if current and (len(current) + 1) * (new_long + new_wide) > cap:
            batches.append(current)
            current, new_long, new_wide = [], lengths[row], widths[row]
        current.append(row)
        long_row, wide = new_long, new_wide
    if current:
        batches.append(current)
    return batches
