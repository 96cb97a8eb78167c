"""Batched, tree-aware frozen-reference scoring: readiness ``l_k`` of many trajectories in a few forwards.

A score depends only on ``(opener, answer, ids[:c])``: it is a property of a tree *node* (a prefix)
and the task's gold answer, not of the leaf that reached it. :func:`score_prefixes_batched` takes
requests (token ids, cuts, opener, answer) from many trajectories and trees and

1. **deduplicates**: every distinct ``(opener, answer, ids[:c])`` is scored once (leaves of one
   tree share ``S_0`` and every boundary above their branch point); prefill rows are the distinct
   maximal sequences ``ids[:max(cuts)]``, and a sequence that is a prefix of another is folded into
   it (its cuts are scored on the longer row);
2. **prefills** rows in batches: rows sorted by length, right-padded (causal attention never lets
   a real token see the padding after it, so no mask is needed), one forward per batch with a KV
   cache and no LM head;
3. **scores all cuts of a batch in one packed forward**: for each unique cut of each row the block
   ``lead + answer[:-1]`` sits at positions ``v, v+1, ...`` where ``lead = opener`` and ``v = c``,
   or, without an opener, ``lead = ids[c-1]`` and ``v = c - 1`` (that token's KV is recomputed so
   that every logit comes from this forward). A 4D additive mask [R, 1, Q, P + Q] lets each block
   see its own row's cache up to ``v`` and itself causally;
4. **projects only what it needs**: hidden states at the ``|y*|`` answer-predicting positions of
   each block go through the LM head in chunks (float32 log-softmax), and the means
   move to the CPU once per batch. Every tensor is built on the model's device.

Shapes: R rows per batch, P = longest row, Q = longest packed run of blocks (sum of
``|lead| + |y*| - 1`` over a row's unique cuts); prefill [R, P], block forward [R, Q].

Memory: a batch holds at most ``max_batch_tokens`` padded tokens (R x (P + Q)); a single row
longer than that forms a batch of its own. The mask is R x Q x (P + Q) elements; logits exist only
for answer positions, at most ``_LOGIT_ELEMENTS`` float32 values at a time.

Across calls, :func:`tracerl.models.scoring.score_readiness` stores each scored boundary on its
tree node, so later calls (the next stage-2 round, the trainer after the scheme) reuse it.

Fallback: attention implementations that ignore custom 4D masks (flash-attention, flex) get the
per-request :func:`~tracerl.models.scoring.score_prefixes` ("crop", one call per request; same
values, no batching). Models whose LM head is not a plain projection of the decoder's last hidden
state (logit soft-capping or scaling) run the full causal-LM forward in stage 3 instead of the
decoder plus a chunked head; values are the same, memory is ``rows x Q x vocab`` logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.models.prefix_cache import forward_with_cache, new_cache, output_cache

DEFAULT_MAX_BATCH_TOKENS = 16384
"""Padded tokens (prefill + packed blocks) per batched forward pair."""
_MASKABLE = ("sdpa", "eager")
_LOGIT_ELEMENTS = 1 << 25  # float32 logits materialised at once by the chunked head (128 MiB)
_SCALED_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass(frozen=True)
class ScoreRequest:
    """One trajectory's scoring job: ``l`` at each cut of ``input_ids`` for ``opener + answer``.

    ``input_ids`` holds at least ``max(cut_points)`` tokens; cuts lie in ``[1, len(input_ids)]``.
    """

    input_ids: tuple[int, ...]
    cut_points: tuple[int, ...]
    answer_ids: tuple[int, ...]
    opener_ids: tuple[int, ...] = ()


@dataclass
class ScoreStats:
    """What one batched call did (for tests, logs and benchmarks)."""

    trajectories: int = 0
    """Trajectories given readiness (set by the tree-level caller, ``score_readiness``)."""
    requests: int = 0
    cuts: int = 0
    """(request, cut) pairs asked for."""
    unique_cuts: int = 0
    """Distinct ``(opener, answer, prefix)`` keys actually scored."""
    reused_cuts: int = 0
    """Cuts answered from tree nodes scored by an earlier call (set by the tree-level caller)."""
    rows: int = 0
    """Prefill rows (distinct maximal sequences that own at least one unique cut)."""
    prefill_tokens: int = 0
    """Prefill tokens including right padding."""
    block_tokens: int = 0
    """Packed block tokens including padding."""
    forwards: int = 0


@dataclass(frozen=True)
class _Cut:
    row: int
    visible: int  # prefix tokens of the row the block attends to
    lead: tuple[int, ...]
    answer: tuple[int, ...]

    @property
    def block(self) -> tuple[int, ...]:
        return self.lead + self.answer[:-1]


def _validate(req: ScoreRequest) -> None:
    if not req.answer_ids:
        raise ValueError("ScoreRequest.answer_ids must not be empty")
    if not req.cut_points:
        raise ValueError("ScoreRequest.cut_points must not be empty")
    bad = [c for c in req.cut_points if not 1 <= c <= len(req.input_ids)]
    if bad:
        raise ValueError(f"ScoreRequest.cut_points must lie in [1, {len(req.input_ids)}] (len(input_ids)); got {bad}")


def _rows(seqs: Sequence[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], dict[tuple[int, ...], int]]:
    """Distinct maximal sequences and the row index covering each sequence.

    In lexicographic order a sequence that is a prefix of any other is a prefix of its successor,
    so one backward pass folds every such sequence into the row of its successor.
    """
    order = sorted(set(seqs))
    rows: list[tuple[int, ...]] = []
    row_of: dict[tuple[int, ...], int] = {}
    for i in reversed(range(len(order))):
        s = order[i]
        if i + 1 < len(order) and order[i + 1][: len(s)] == s:
            row_of[s] = row_of[order[i + 1]]
        else:
            row_of[s] = len(rows)
            rows.append(s)
    return rows, row_of


def _plan(requests: Sequence[ScoreRequest]) -> tuple[list[tuple[int, ...]], list[_Cut], list[list[int]]]:
    """Rows, unique cuts, and for each request the unique-cut index of each of its cuts."""
    seqs = [tuple(r.input_ids[: max(r.cut_points)]) for r in requests]
    rows, row_of = _rows(seqs)
    index: dict[tuple[Any, ...], int] = {}
    cuts: list[_Cut] = []
    where: list[list[int]] = []
    for req, seq in zip(requests, seqs):
        opener, answer, mine = tuple(req.opener_ids), tuple(req.answer_ids), []
        for c in req.cut_points:
            key = (opener, answer, seq[:c])
            if key not in index:
                index[key] = len(cuts)
                lead, visible = (opener, c) if opener else ((seq[c - 1],), c - 1)
                cuts.append(_Cut(row_of[seq], visible, lead, answer))
            mine.append(index[key])
        where.append(mine)
    return rows, cuts, where


def _batches(lengths: dict[int, int], widths: dict[int, int], cap: int) -> list[list[int]]:
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


def _split_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` when logits are a plain projection of the decoder's last hidden state."""
    if any(getattr(model.config, name, None) not in (None, 1.0) for name in _SCALED_HEAD):
        return None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if not (callable(get_decoder) and callable(get_head)):
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def _forward(model: Any, split: tuple[Any, Any] | None, ids: torch.Tensor, cache: Any, prefill: bool,
             **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Hidden states (split head) or logits [R, T, *] and the updated cache.

    Without a split head the prefill keeps one logit per row (unused) and the block forward all.
    """
    if split is not None:
        out = forward_with_cache(split[0], ids, cache, **kwargs)
        return out.last_hidden_state, output_cache(out)
    out = forward_with_cache(model, ids, cache, logits_to_keep=1 if prefill else 0, **kwargs)
    return out.logits, output_cache(out)


def _block_mask(visible: torch.Tensor, start: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [R, 1, Q, P + Q]: query q of row r sees the row's cache below ``visible[r, q]``
    and the block tokens from ``start[r, q]`` up to itself (padding queries: only themselves)."""
    q_len = visible.shape[1]
    keys = torch.arange(prefix_len, device=visible.device)
    q = torch.arange(q_len, device=visible.device)
    see_prefix = keys[None, None, :] < visible[:, :, None]
    see_block = (q[None, None, :] >= start[:, :, None]) & (q[None, None, :] <= q[None, :, None])
    allowed = torch.cat([see_prefix, see_block], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def _layout(cuts: Sequence[Sequence[_Cut]]) -> dict[str, list[list[int]] | list[int]]:
    """Packed block runs per row, right-padded to the longest: ids, positions, visible, start
    [R][Q] lists, plus flat (row, query, target token, cut slot) lists of answer positions."""
    width = max(sum(len(c.block) for c in row) for row in cuts)
    lay: dict[str, Any] = {k: [] for k in ("ids", "pos", "vis", "start", "r", "q", "target", "slot")}
    slot = 0
    for r, row in enumerate(cuts):
        ids, pos, vis, start = [], [], [], []
        for cut in row:
            s = len(ids)
            block = cut.block
            ids += block
            pos += range(cut.visible, cut.visible + len(block))
            vis += [cut.visible] * len(block)
            start += [s] * len(block)
            first = s + len(cut.lead) - 1  # the query whose logits predict answer[0]
            for j, token in enumerate(cut.answer):
                lay["r"].append(r), lay["q"].append(first + j), lay["target"].append(token), lay["slot"].append(slot)
            slot += 1
        pad = width - len(ids)
        lay["ids"].append(ids + [0] * pad)
        lay["pos"].append(pos + [0] * pad)
        lay["vis"].append(vis + [0] * pad)
        lay["start"].append(start + list(range(len(start), width)))
    return lay


def _target_logprobs(split: tuple[Any, Any] | None, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float32 log-prob of ``targets`` [N] under hidden states (or logits) ``rows`` [N, H], chunked."""
    out = []
    vocab = rows.shape[-1] if split is None else max(1, int(getattr(split[1], "out_features", 1 << 17)))
    step = max(1, _LOGIT_ELEMENTS // vocab)
    for i in range(0, rows.shape[0], step):
        chunk = rows[i : i + step]
        logits = split[1](chunk) if split is not None else chunk
        # a fused log-softmax (measured faster on CPU than logit[y] - logsumexp)
        logp = torch.log_softmax(logits.float(), dim=-1)
        out.append(logp.gather(-1, targets[i : i + step, None]).squeeze(-1))
    return torch.cat(out)


def _score_batch(model: Any, split: tuple[Any, Any] | None, rows: Sequence[Sequence[int]],
                 cuts: Sequence[Sequence[_Cut]], stats: ScoreStats) -> torch.Tensor:
    """Mean answer log-probs (float32, CPU) of the cuts of ``rows``, in row-major cut order."""
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    _, cache = _forward(model, split, ids, new_cache(model), prefill=True)
    lay = _layout(cuts)
    t = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in lay.items()}
    mask = _block_mask(t["vis"], t["start"], width, model.dtype)
    out, _ = _forward(model, split, t["ids"], cache, prefill=False, attention_mask=mask, position_ids=t["pos"])
    logp = _target_logprobs(split, out[t["r"], t["q"]], t["target"])
    n_cuts = sum(len(row) for row in cuts)
    sums = torch.zeros(n_cuts, dtype=torch.float32, device=device).index_add_(0, t["slot"], logp)
    counts = torch.tensor([len(c.answer) for row in cuts for c in row], dtype=torch.float32, device=device)
    stats.forwards += 2
    stats.prefill_tokens += ids.numel()
    stats.block_tokens += t["ids"].numel()
    return (sums / counts).cpu()


@torch.no_grad()
def score_prefixes_batched(
    model: Any,
    requests: Sequence[ScoreRequest],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    stats: ScoreStats | None = None,
) -> list[torch.Tensor]:
    """``l`` at every cut of every request, each distinct prefix scored once (see the module doc).

    Returns one float32 CPU tensor [len(request.cut_points)] per request, in request and cut
    order; the values equal :func:`~tracerl.models.scoring.score_prefixes` per request up to float
    noise. ``stats`` (optional) is filled with what the call did.
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    stats = stats if stats is not None else ScoreStats()
    for req in requests:
        _validate(req)
    stats.requests += len(requests)
    stats.cuts += sum(len(r.cut_points) for r in requests)
    if not requests:
        return []
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in _MASKABLE:
        return _score_each(model, requests, stats)
    rows, cuts, where = _plan(requests)
    by_row: dict[int, list[int]] = {}
    for u, cut in enumerate(cuts):
        by_row.setdefault(cut.row, []).append(u)
    lengths = {r: max(1, max(cuts[u].visible for u in us)) for r, us in by_row.items()}
    widths = {r: sum(len(cuts[u].block) for u in us) for r, us in by_row.items()}
    scores = torch.empty(len(cuts), dtype=torch.float32)
    split = _split_head(model)
    for batch in _batches(lengths, widths, max_batch_tokens):
        members = [by_row[r] for r in batch]
        values = _score_batch(model, split, [rows[r][: lengths[r]] for r in batch],
                              [[cuts[u] for u in us] for us in members], stats)
        scores[torch.tensor([u for us in members for u in us])] = values
    stats.unique_cuts += len(cuts)
    stats.rows += len(by_row)
    return [scores[torch.tensor(w)] for w in where]


def _score_each(model: Any, requests: Sequence[ScoreRequest], stats: ScoreStats) -> list[torch.Tensor]:
    """Fallback for attention without custom 4D masks: one cache-reusing call per request."""
    from tracerl.models.scoring import score_prefixes

    out = []
    for req in requests:
        opener = torch.tensor(req.opener_ids, dtype=torch.long) if req.opener_ids else None
        out.append(score_prefixes(model, torch.tensor(req.input_ids, dtype=torch.long), list(req.cut_points),
                                  torch.tensor(req.answer_ids, dtype=torch.long), opener_ids=opener))
        stats.unique_cuts += len(req.cut_points)
        stats.rows += 1
    return out
