"""Per-trajectory frozen reference scoring: ``l_k`` at every cut of one token sequence.

``l_k = (1/|y*|) sum_j log pi_ref(y*_j | S_k + A, y*_<j)`` for every boundary ``S_k`` of a
trajectory. :func:`score_prefixes` computes all ``l_k`` with one prefill of the trajectory up to
its last cut plus one packed forward that holds ``opener + answer`` once per cut, each copy
attending only to its own prefix (a block-diagonal 4D mask over the cached prefix), so the work
is about ``max(cuts) + cuts * (|A| + |y*|)`` tokens instead of ``cuts * L``; attention without
custom 4D masks (:data:`MASKABLE_ATTENTION`) gets "crop", one cache extended cut by cut.
:func:`score_prefixes_naive` (one full forward per cut) is the test oracle.

The bottom of the scorers: :mod:`tracerl.models.batched_scoring` falls back to
:func:`score_prefixes` per request, and :mod:`tracerl.models.scoring` (which re-exports both
functions) uses it for :meth:`~tracerl.models.scoring.ReferenceScorer.readiness`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from tracerl.models.prefix_cache import forward_with_cache, new_cache, output_cache

Method = Literal["packed", "crop"]
MASKABLE_ATTENTION = ("sdpa", "eager")
"""Attention implementations that accept custom 4D masks (the packed scorers need them)."""


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean [R, Q, K] -> additive [R, 1, Q, K] (0 where allowed, the dtype's minimum elsewhere)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def tree_attention_mask(end: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Prefill mask [R, 1, P, P] of trie rows: token p sees k iff k is an ancestor-or-self of p,
    i.e. ``k <= p < end[k]`` (padding has ``end[k] = k + 1``: it sees only itself)."""
    pos = torch.arange(end.shape[1], device=end.device)
    allowed = (pos[None, None, :] <= pos[None, :, None]) & (pos[None, :, None] < end[:, None, :])
    return additive_mask(allowed, dtype)


def _check_inputs(
    input_ids: torch.Tensor, cut_points: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> None:
    if input_ids.ndim != 1 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(input_ids.shape)}")
    if answer_ids.ndim != 1 or answer_ids.numel() == 0:
        raise ValueError(f"answer_ids must be a non-empty 1-D tensor, got shape {tuple(answer_ids.shape)}")
    if opener_ids is not None and opener_ids.ndim != 1:
        raise ValueError(f"opener_ids must be 1-D, got shape {tuple(opener_ids.shape)}")
    if not cut_points:
        raise ValueError("cut_points must not be empty")
    length = input_ids.numel()
    bad = [c for c in cut_points if not 1 <= int(c) <= length]
    if bad:
        raise ValueError(f"cut_points must lie in [1, {length}] (len(input_ids)); got {bad}")


def _block(answer_ids: torch.Tensor, opener_ids: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Tokens fed after each cut (opener + answer without its last token) and the opener length."""
    opener = opener_ids if opener_ids is not None else answer_ids.new_zeros(0)
    return torch.cat([opener, answer_ids[:-1]]), opener.numel()


def _mean_logprob(logits: torch.Tensor, answer_ids: torch.Tensor) -> torch.Tensor:
    """Mean log-prob of ``answer_ids`` [A] under next-token ``logits`` [A, V]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, answer_ids[:, None]).squeeze(-1).mean()


@torch.no_grad()
def score_prefixes_naive(
    model: Any,
    input_ids: torch.Tensor,
    cut_points: list[int],
    answer_ids: torch.Tensor,
    *,
    opener_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Oracle: one full forward over ``input_ids[:c] + opener + answer`` per cut. Returns [len(cuts)]."""
    _check_inputs(input_ids, cut_points, answer_ids, opener_ids)
    device = next(model.parameters()).device
    input_ids, answer_ids = input_ids.to(device), answer_ids.to(device)
    opener = opener_ids.to(device) if opener_ids is not None else answer_ids.new_zeros(0)
    scores = []
    for cut in cut_points:
        seq = torch.cat([input_ids[:cut], opener, answer_ids])
        logits = model(input_ids=seq[None]).logits[0]
        first = cut + opener.numel() - 1  # position whose logits predict answer_ids[0]
        scores.append(_mean_logprob(logits[first : first + answer_ids.numel()], answer_ids))
    return torch.stack(scores).cpu()


@torch.no_grad()
def score_prefixes(
    model: Any,
    input_ids: torch.Tensor,
    cut_points: list[int],
    answer_ids: torch.Tensor,
    *,
    opener_ids: torch.Tensor | None = None,
    method: Method | None = None,
) -> torch.Tensor:
    """Mean log-prob of ``answer_ids`` placed after ``input_ids[:c] + opener`` for each cut ``c``.

    Shapes: ``input_ids`` [L], ``answer_ids`` [A], ``opener_ids`` [O] or None; returns float32
    [len(cut_points)] on CPU in the order of ``cut_points``. ``method`` "packed" (default when
    the attention implementation accepts custom 4D masks) does one prefill plus one packed
    forward; "crop" extends one cache cut by cut and crops the scored block off each time.
    """
    _check_inputs(input_ids, cut_points, answer_ids, opener_ids)
    if method is None:
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        method = "packed" if impl in MASKABLE_ATTENTION else "crop"
    if method not in ("packed", "crop"):
        raise ValueError(f"method must be 'packed' or 'crop', got {method!r}")
    device = next(model.parameters()).device
    input_ids, answer_ids = input_ids.to(device), answer_ids.to(device)
    opener_ids = opener_ids.to(device) if opener_ids is not None else None
    cuts = [int(c) for c in cut_points]
    if method == "packed":
        return _score_packed(model, input_ids, cuts, answer_ids, opener_ids).cpu()
    return _score_crop(model, input_ids, cuts, answer_ids, opener_ids).cpu()


def _score_packed(
    model: Any, input_ids: torch.Tensor, cuts: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> torch.Tensor:
    block, n_open = _block(answer_ids, opener_ids)
    width, n_cuts, n_ans = block.numel(), len(cuts), answer_ids.numel()
    prefix_len = max(cuts)
    device = input_ids.device
    # Without an opener the first answer token is predicted by the prefix's own last position.
    keep = torch.tensor(sorted({c - 1 for c in cuts}), device=device)
    cache = new_cache(model)
    out = forward_with_cache(model, input_ids[None, :prefix_len], cache, logits_to_keep=keep)
    prefix_logits = {int(p): out.logits[0, i] for i, p in enumerate(keep.tolist())}
    if width == 0:  # no opener and a one-token answer: the prefill logits are all we need
        return torch.stack([_mean_logprob(prefix_logits[c - 1][None], answer_ids) for c in cuts])
    cuts_t = torch.tensor(cuts, device=device)
    offsets = torch.arange(width, device=device)
    position_ids = (cuts_t[:, None] + offsets[None, :]).reshape(1, -1)
    mask = _packed_mask(cuts_t, width, prefix_len, model.dtype)
    out = forward_with_cache(
        model,
        block.repeat(n_cuts)[None],
        output_cache(out),
        attention_mask=mask,
        position_ids=position_ids,
    )
    logits = out.logits[0].view(n_cuts, width, -1)
    scores = []
    for i, cut in enumerate(cuts):
        if n_open > 0:
            rows = logits[i, n_open - 1 : n_open - 1 + n_ans]
        else:
            rows = torch.cat([prefix_logits[cut - 1][None], logits[i, : n_ans - 1]])
        scores.append(_mean_logprob(rows, answer_ids))
    return torch.stack(scores)


def _packed_mask(cuts: torch.Tensor, width: int, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, cuts*width, prefix_len + cuts*width]: block i sees prefix[:c_i] and itself causally."""
    n = cuts.numel()
    q = n * width
    block_of_q = torch.arange(q, device=cuts.device) // width
    allowed_prefix = torch.arange(prefix_len, device=cuts.device)[None, :] < cuts[block_of_q][:, None]
    kq = torch.arange(q, device=cuts.device)
    same_block = block_of_q[:, None] == block_of_q[None, :]
    allowed_block = same_block & (kq[None, :] <= kq[:, None])
    allowed = torch.cat([allowed_prefix, allowed_block], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=cuts.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _score_crop(
    model: Any, input_ids: torch.Tensor, cuts: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> torch.Tensor:
    block, n_open = _block(answer_ids, opener_ids)
    n_ans = answer_ids.numel()
    cache, pos, last_logits = new_cache(model), 0, None
    scores: dict[int, torch.Tensor] = {}
    for i in sorted(range(len(cuts)), key=lambda j: cuts[j]):
        cut = cuts[i]
        if cut > pos:  # extend the shared cache up to this cut
            out = forward_with_cache(model, input_ids[None, pos:cut], cache, logits_to_keep=1)
            cache, last_logits, pos = output_cache(out), out.logits[0, -1], cut
        if block.numel() == 0:
            scores[i] = _mean_logprob(last_logits[None], answer_ids)
            continue
        out = forward_with_cache(model, block[None], cache)
        cache, logits = output_cache(out), out.logits[0]
        rows = logits[n_open - 1 : n_open - 1 + n_ans] if n_open else torch.cat([last_logits[None], logits[: n_ans - 1]])
        scores[i] = _mean_logprob(rows, answer_ids)
        cache.crop(-block.numel())  # drop the scored block, keep the prefix for the next cut
    return torch.stack([scores[i] for i in range(len(cuts))])
