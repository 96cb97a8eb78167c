"""Prefill for :class:`~tracerl.models.backend.HFPolicy`: the uncached suffixes of a call's
unique prefixes in one or a few forwards, on top of KV reused from the prefix store.

Rows are bucketed by suffix length and merged by left padding (:func:`prefill`); each bucket's
rows are laid out ``[pad][stored KV][pad][suffix]`` with explicit positions
(:func:`_prefill_bucket`). When recording states, :func:`_last_state_hook` reads each row's
last-token hidden state (the success predictor's ``hidden`` input) off the same forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tracerl.models.heads import split_head
from tracerl.models.prefix_cache import KVEntry, forward_with_cache, left_pad, new_cache, output_cache


@contextmanager
def _last_state_hook(model: Any) -> Iterator[list[torch.Tensor]]:
    """Collect the decoder's last hidden state at the last position [B, H] of the forwards run
    inside (a forward hook on the decoder, whose output is the final norm's: no extra forward,
    and only the last column is kept). ``model`` None, or a model without a separable decoder:
    nothing is collected."""
    grabbed: list[torch.Tensor] = []
    split = split_head(model) if model is not None else None
    if split is None:
        yield grabbed
        return

    def hook(module: Any, args: Any, output: Any) -> None:
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        grabbed.append(hidden[:, -1, :].detach())

    handle = split[0].register_forward_hook(hook)
    try:
        yield grabbed
    finally:
        handle.remove()


def prefill(
    model: Any, seqs: list[list[int]], hits: list[tuple[KVEntry | None, int]], pad_token_id: int,
    record_states: bool,
) -> tuple[torch.Tensor, Any, torch.Tensor, list[list[float]] | None]:
    """Prefill the uncached suffixes; returns last logits [U, V], cache, mask [U, W] and, when
    recording states, each row's last-token hidden state [H] (else None).

    Rows are bucketed by suffix length (within a factor 2) so one long new prompt does not
    pad every short observation suffix to its length; buckets are merged by left padding.
    """
    order = sorted(range(len(seqs)), key=lambda i: -(len(seqs[i]) - hits[i][1]))
    buckets: list[list[int]] = []
    for i in order:
        if buckets and 2 * (len(seqs[i]) - hits[i][1]) >= len(seqs[buckets[-1][0]]) - hits[buckets[-1][0]][1]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    parts = [_prefill_bucket(model, [seqs[i] for i in b], [hits[i] for i in b], pad_token_id, record_states)
             for b in buckets]
    flat = [i for b in buckets for i in b]
    position = {row: slot for slot, row in enumerate(flat)}
    inverse = torch.tensor([position[row] for row in range(len(flat))], device=parts[0][0].device)
    states = None
    if all(st is not None for *_, st in parts):  # one device-to-host copy for all rows
        states = torch.cat([st for *_, st in parts])[inverse].float().cpu().tolist()  # type: ignore[misc]
    if len(parts) == 1:
        logits, cache, mask, _ = parts[0]
        if flat != sorted(flat):
            cache.batch_select_indices(inverse)
        return logits[inverse], cache, mask[inverse], states
    width = max(m.shape[1] for _, _, m, _ in parts)
    merged = new_cache(model)
    for layer in range(len(parts[0][1].layers)):
        keys = [left_pad(c.layers[layer].keys, width, dim=2) for _, c, _, _ in parts]
        values = [left_pad(c.layers[layer].values, width, dim=2) for _, c, _, _ in parts]
        merged.update(torch.cat(keys)[inverse], torch.cat(values)[inverse], layer)
    mask = torch.cat([left_pad(m, width, dim=1) for _, _, m, _ in parts])[inverse]
    logits = torch.cat([lg for lg, _, _, _ in parts])[inverse]
    return logits, merged, mask, states

def _prefill_bucket(
    model: Any, seqs: list[list[int]], hits: list[tuple[KVEntry | None, int]], pad_token_id: int,
    record_states: bool,
) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor | None]:
    """Row layout: [pad][stored KV c_r][pad][suffix s_r], suffixes right-aligned (so column -1
    is every row's last token, whose hidden state is the row's state when recording)."""
    device = next(model.parameters()).device  # HFPolicy.device
    rows = len(seqs)
    cached = max(k for _, k in hits)
    width = max(len(p) - k for p, (_, k) in zip(seqs, hits, strict=True))
    cache = new_cache(model)
    if cached > 0:
        sample = next(e for e, k in hits if k > 0).layers  # type: ignore[union-attr]
        for layer, (k0, _) in enumerate(sample):
            keys = k0.new_zeros((rows, k0.shape[0], cached, k0.shape[2]))
            values = torch.zeros_like(keys)
            for r, (entry, k) in enumerate(hits):
                if k > 0:
                    keys[r, :, cached - k :] = entry.layers[layer][0][:, :k]  # type: ignore[union-attr]
                    values[r, :, cached - k :] = entry.layers[layer][1][:, :k]  # type: ignore[union-attr]
            cache.update(keys, values, layer)
    # Built as Python lists and sent to the model's device in one copy each.
    ids, mask, positions = [], [], []
    for seq, (_, k) in zip(seqs, hits, strict=True):
        suffix = len(seq) - k
        ids.append([pad_token_id] * (width - suffix) + seq[k:])
        mask.append([0] * (cached - k) + [1] * k + [0] * (width - suffix) + [1] * suffix)
        # Explicit positions: a padded row sees the same positions as an unpadded one.
        positions.append([0] * (width - suffix) + list(range(k, len(seq))))
    ids_t = torch.tensor(ids, dtype=torch.long, device=device)
    mask_t = torch.tensor(mask, dtype=torch.long, device=device)
    positions_t = torch.tensor(positions, dtype=torch.long, device=device)
    with _last_state_hook(model if record_states else None) as state:
        out = forward_with_cache(
            model, ids_t, cache, attention_mask=mask_t, position_ids=positions_t, logits_to_keep=1
        )
    return out.logits[:, -1, :], output_cache(out), mask_t, state[0] if state else None
