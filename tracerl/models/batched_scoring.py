"""Batched, tree-aware frozen-reference scoring: readiness ``l_k`` of many trajectories in a few forwards.

A score depends only on ``(opener, answer, ids[:c])``: it is a property of a tree *node* (a prefix)
and the task's gold answer, not of the leaf that reached it. :func:`score_prefixes_batched` takes
requests (token ids, cuts, opener, answer) from many trajectories and trees and

1. **deduplicates cuts**: every distinct ``(opener, answer, ids[:c])`` is scored once (leaves of
   one tree share ``S_0`` and every boundary above their branch point);
2. **prefills each shared prefix once**: the distinct maximal sequences ``ids[:max(cuts)]`` (a
   sequence that is a prefix of another folds into it) are sorted and packed into *trie rows*:
   sequences sharing a prefix with their predecessor append only their new tokens, so a row holds
   each token of a tree once, in depth-first order, with position ids = depth and a tree mask
   (token ``p`` sees ``k`` iff ``k <= p < end[k]``). Rows are right-padded and batched by length;
   a batch of single-sequence rows needs no mask at all (plain causal). No LM head is applied;
3. **scores all cuts of a batch in one packed forward**: for each unique cut the block
   ``lead + answer[:-1]`` sits at positions ``v, v+1, ...`` where ``lead = opener`` and ``v = c``,
   or, without an opener, ``lead = ids[c-1]`` and ``v = c - 1`` (that token's KV is recomputed so
   that every logit comes from this forward). A 4D additive mask [R, 1, Q, P + Q] lets each block
   see its own path's cached tokens below ``v`` (the ancestors of its anchor token) and itself
   causally;
4. **projects only what it needs**: hidden states at the ``|y*|`` answer-predicting positions of
   each block go through the LM head in chunks (float32 log-softmax), and the means
   move to the CPU once per batch. Every tensor is built on the model's device.

Shapes: R rows per batch, P = longest row, Q = longest run of blocks in a row (sum of
``|lead| + |y*| - 1`` over its unique cuts); prefill [R, P], block forward [R, Q].

Memory: a batch holds at most ``max_batch_tokens`` padded tokens (R x (P + Q)); a trie row holds
at most ``max_row_tokens`` (a longer sequence gets a row, and a batch, of its own). Masks are
R x P x P (prefill, only with trie rows) and R x Q x (P + Q) elements of the model's dtype; logits
exist only for answer positions, at most ``_LOGIT_ELEMENTS`` float32 values at a time.

Across calls, :func:`tracerl.models.scoring.score_readiness` stores each scored boundary on its
tree node, so later calls (the next stage-2 round, the trainer after the scheme) reuse it.

Fallback: attention implementations that ignore custom 4D masks (flash-attention, flex) get the
per-request :func:`~tracerl.models.prefix_scoring.score_prefixes` ("crop", one call per request; same
values, no batching). Models whose LM head is not a plain projection of the decoder's last hidden
state (logit soft-capping or scaling) run the full causal-LM forward in stage 3 instead of the
decoder plus a chunked head; values are the same, memory is ``rows x Q x vocab`` logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.models.heads import head_logprobs, rescales_logits, split_head
from tracerl.models.prefix_cache import forward_with_cache, new_cache, output_cache
from tracerl.models.prefix_scoring import MASKABLE_ATTENTION, additive_mask, score_prefixes, tree_attention_mask
from tracerl.models.scoring_plan import Cut, Row, ScoreRequest, group_batches, plan_requests, validate_request

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "DEFAULT_MAX_ROW_TOKENS", "ScoreRequest", "ScoreStats", "score_prefixes_batched"]

DEFAULT_MAX_BATCH_TOKENS = 16384
"""Padded tokens (prefill + packed blocks) per batched forward pair."""
DEFAULT_MAX_ROW_TOKENS = 4096
"""Tokens of one trie row (sequences sharing a prefix packed together; its mask is P x P)."""
_LOGIT_ELEMENTS = 1 << 25  # float32 logits materialised at once by the chunked head (128 MiB)


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
    """Distinct tokens prefilled (a trie row holds a shared prefix once), without padding."""
    block_tokens: int = 0
    """Block tokens (opener + answer per unique cut), without padding."""
    padded_tokens: int = 0
    """Tokens fed to the model including padding (prefill and block forwards)."""
    forwards: int = 0


def _split_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` when logits are a plain projection of the decoder's last hidden state
    (a family that rescales its logits takes the full-logits path)."""
    return None if rescales_logits(model.config) else split_head(model)


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


def _block_mask(anchor: torch.Tensor, start: torch.Tensor, end: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [R, 1, Q, P + Q]: query q of row r sees the row's cached ancestors-or-self of
    slot ``anchor[r, q]`` (none for -1) and the block tokens from ``start[r, q]`` up to itself."""
    q = torch.arange(anchor.shape[1], device=anchor.device)
    keys = torch.arange(end.shape[1], device=anchor.device)
    a = anchor[:, :, None]
    see_prefix = (keys[None, None, :] <= a) & (a < end[:, None, :])
    see_block = (q[None, None, :] >= start[:, :, None]) & (q[None, None, :] <= q[None, :, None])
    return additive_mask(torch.cat([see_prefix, see_block], dim=-1), dtype)


def _layout(cuts: Sequence[Sequence[Cut]]) -> dict[str, list[list[int]] | list[int]]:
    """Packed block runs per row, right-padded to the longest: ids, positions, anchor, start
    [R][Q] lists, plus flat (row, query, target token, cut slot) lists of answer positions."""
    width = max(sum(len(c.block) for c in row) for row in cuts)
    lay: dict[str, Any] = {k: [] for k in ("ids", "pos", "anchor", "start", "r", "q", "target", "slot")}
    slot = 0
    for r, row in enumerate(cuts):
        ids, pos, anchor, start = [], [], [], []
        for cut in row:
            s = len(ids)
            block = cut.block
            ids += block
            pos += range(cut.visible, cut.visible + len(block))
            anchor += [cut.anchor] * len(block)
            start += [s] * len(block)
            first = s + len(cut.lead) - 1  # the query whose logits predict answer[0]
            for j, token in enumerate(cut.answer):
                lay["r"].append(r), lay["q"].append(first + j), lay["target"].append(token), lay["slot"].append(slot)
            slot += 1
        pad = width - len(ids)
        lay["ids"].append(ids + [0] * pad)
        lay["pos"].append(pos + [0] * pad)
        lay["anchor"].append(anchor + [-1] * pad)
        lay["start"].append(start + list(range(len(start), width)))
    return lay


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _target_logprobs(split: tuple[Any, Any] | None, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float32 log-prob of ``targets`` [N] under hidden states (or logits) ``rows`` [N, H], chunked."""
    out = []
    vocab = rows.shape[-1] if split is None else max(1, int(getattr(split[1], "out_features", 1 << 17)))
    step = max(1, _LOGIT_ELEMENTS // vocab)
    for i in range(0, rows.shape[0], step):
        chunk = rows[i : i + step]
        out.append(head_logprobs(chunk, targets[i : i + step], split[1] if split is not None else _identity))
    return torch.cat(out)


def _prefill(model: Any, split: tuple[Any, Any] | None, rows: Sequence[Row], device: torch.device,
             stats: ScoreStats) -> tuple[Any, torch.Tensor]:
    """KV cache of the right-padded rows [R, P] and their ``end`` [R, P].

    Rows of single sequences need no mask (causal attention never reaches the padding after a
    token); a batch with a trie row gets the tree mask and depth position ids."""
    width = max(len(r.tokens) for r in rows)
    ids = torch.tensor([r.tokens + [0] * (width - len(r.tokens)) for r in rows], dtype=torch.long, device=device)
    end = torch.tensor([r.end + list(range(len(r.end) + 1, width + 1)) for r in rows], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {}
    if any(r.members > 1 for r in rows):
        depth = [r.depth + [0] * (width - len(r.depth)) for r in rows]
        kwargs = {"attention_mask": tree_attention_mask(end, model.dtype),
                  "position_ids": torch.tensor(depth, dtype=torch.long, device=device)}
    _, cache = _forward(model, split, ids, new_cache(model), prefill=True, **kwargs)
    stats.prefill_tokens += sum(len(r.tokens) for r in rows)
    stats.padded_tokens += ids.numel()
    return cache, end


def _score_batch(model: Any, split: tuple[Any, Any] | None, rows: Sequence[Row],
                 cuts: Sequence[Sequence[Cut]], stats: ScoreStats) -> torch.Tensor:
    """Mean answer log-probs (float32, CPU) of the cuts of ``rows``, in row-major cut order."""
    device = next(model.parameters()).device
    cache, end = _prefill(model, split, rows, device, stats)
    lay = _layout(cuts)
    t = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in lay.items()}
    mask = _block_mask(t["anchor"], t["start"], end, model.dtype)
    out, _ = _forward(model, split, t["ids"], cache, prefill=False, attention_mask=mask, position_ids=t["pos"])
    logp = _target_logprobs(split, out[t["r"], t["q"]], t["target"])
    n_cuts = sum(len(row) for row in cuts)
    sums = torch.zeros(n_cuts, dtype=torch.float32, device=device).index_add_(0, t["slot"], logp)
    counts = torch.tensor([len(c.answer) for row in cuts for c in row], dtype=torch.float32, device=device)
    stats.forwards += 2
    stats.block_tokens += sum(len(c.block) for row in cuts for c in row)
    stats.padded_tokens += t["ids"].numel()
    return (sums / counts).cpu()


@torch.no_grad()
def score_prefixes_batched(
    model: Any,
    requests: Sequence[ScoreRequest],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    max_row_tokens: int = DEFAULT_MAX_ROW_TOKENS,
    stats: ScoreStats | None = None,
) -> list[torch.Tensor]:
    """``l`` at every cut of every request, each distinct prefix scored once (see the module doc).

    Returns one float32 CPU tensor [len(request.cut_points)] per request, in request and cut
    order; the values equal :func:`~tracerl.models.prefix_scoring.score_prefixes` per request up to float
    noise. ``max_row_tokens`` caps a trie row (its prefill mask is rows x P x P; 1 disables packing:
    every maximal sequence is prefilled in full with a plain causal forward); ``stats`` (optional)
    is filled with what the call did.
    """
    for name, value in (("max_batch_tokens", max_batch_tokens), ("max_row_tokens", max_row_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    stats = stats if stats is not None else ScoreStats()
    for req in requests:
        validate_request(req)
    stats.requests += len(requests)
    stats.cuts += sum(len(r.cut_points) for r in requests)
    if not requests:
        return []
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in MASKABLE_ATTENTION:
        return _score_each(model, requests, stats)
    rows, cuts, where = plan_requests(requests, max_row_tokens)
    by_row: dict[int, list[int]] = {}
    for u, cut in enumerate(cuts):
        by_row.setdefault(cut.row, []).append(u)
    widths = {r: sum(len(cuts[u].block) for u in us) for r, us in by_row.items()}
    scores = torch.empty(len(cuts), dtype=torch.float32)
    split = _split_head(model)
    for tree in (False, True):  # single-sequence rows keep the maskless causal prefill
        lengths = {r: len(rows[r].tokens) for r in by_row if (rows[r].members > 1) == tree}
        for batch in group_batches(lengths, widths, max_batch_tokens):
            members = [by_row[r] for r in batch]
            values = _score_batch(model, split, [rows[r] for r in batch], [[cuts[u] for u in us] for us in members],
                                  stats)
            scores[torch.tensor([u for us in members for u in us])] = values
    stats.unique_cuts += len(cuts)
    stats.rows += len(by_row)
    return [scores[torch.tensor(w)] for w in where]


def _score_each(model: Any, requests: Sequence[ScoreRequest], stats: ScoreStats) -> list[torch.Tensor]:
    """Fallback for attention without custom 4D masks: one cache-reusing call per request."""
    out = []
    for req in requests:
        opener = torch.tensor(req.opener_ids, dtype=torch.long) if req.opener_ids else None
        out.append(score_prefixes(model, torch.tensor(req.input_ids, dtype=torch.long), list(req.cut_points),
                                  torch.tensor(req.answer_ids, dtype=torch.long), opener_ids=opener))
        stats.unique_cuts += len(req.cut_points)
        stats.rows += 1
    return out
