"""Tree packing for the update: the leaves of a tree trained on one forward of the tree.

The leaves of a rollout tree share their prompt and every turn above their branch point. Trained
as separate sequences, each shared token is forwarded and back-propagated once per leaf. Packed,
a micro-batch's sequences are laid out as trie rows
(:func:`~tracerl.models.scoring_plan.trie_rows`): each distinct prefix once, depth-first,
position id = depth, under a tree attention mask (token ``p`` sees ``k`` iff ``k`` is an
ancestor-or-self of ``p``: ``k <= p < end[k]``). A node then sees exactly the tokens, at exactly
the positions, it sees in any leaf that contains it, so its hidden state and log-prob are the
per-leaf ones; each is computed once and gathered into every leaf that contains the node.

The loss receives the same ``[B, L]`` log-probs as the padded path, so every per-leaf term (the
clipped surrogate, GSPO's sequence ratio, the KL term, the credit-weighted advantages, the
aggregation and its normaliser) is unchanged; autograd sums the leaves' gradients on a shared
node's one log-prob, which is the sum of the per-leaf gradients. Equal up to float rounding
(the attention sums run in another order).

Cost: a row's attention is dense (P x P scores, masked), so a row stops growing once P squared
would pass the sum of its sequences' squared lengths: attention never costs more than training
the leaves apart, and every other layer runs on the distinct tokens only. Trees that share
little (chains of one prompt) gain little.

Only nodes the loss reads go through the LM head: a token that some leaf trains (sampled).
Needs an attention implementation that takes custom 4D masks (``sdpa``, ``eager``).

``optim.packed_attention = 'flex'`` (:func:`flex_packed_logprobs`) runs the same rule through
``flex_attention`` with a block mask instead: no P x P tensor, masked tiles skipped, so the
quadratic row rule is dropped (a row still stops at ``row_cap`` tokens). CUDA only for training
(torch has no FlexAttention backward on CPU); its forward runs on CPU, where tests compare it with
the dense path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from tracerl.models.heads import chunked_head_logprobs, logit_transform, split_head
from tracerl.models.prefix_scoring import MASKABLE_ATTENTION, tree_attention_mask
from tracerl.models.scoring_plan import trie_rows
from tracerl.train.flex_packing import flex_scope, tree_block_mask

PACK_ROW_TOKENS = 4096
"""Tokens of one packed row (a longer sequence gets a row of its own). A row's mask is P x P
elements of the working dtype: 64 MiB in float32 at 4,096."""

FSDP_PACKED_LOGPROBS = "tracerl_packed_logprobs"
"""Name of the FSDP-registered packed forward a sharded model carries (distributed/fsdp.py)."""


@dataclass
class PackedTrees:
    """A micro-batch of ``B`` sequences packed into ``R`` trie rows of ``P`` slots."""

    input_ids: Tensor
    """[R, P] token of each slot (``pad_id`` after a row's end)."""
    position_ids: Tensor
    """[R, P] depth of each slot in its sequences (its position in every leaf containing it)."""
    end: Tensor
    """[R, P] one past the last slot of each slot's subtree (``k + 1`` for padding)."""
    sources: Tensor
    """[U] flat slot ``r * P + parent`` whose hidden state predicts each needed node."""
    targets: Tensor
    """[U] token id of each needed node."""
    gather: Tensor
    """[B, L] ``1 + u`` of the needed node at each sequence position, 0 elsewhere (not trained)."""
    tokens: int
    """Distinct tokens forwarded (the rows' lengths, without padding)."""


def pack_trees(sequences: Sequence[Sequence[int]], trained: Sequence[Sequence[bool]], pad_id: int,
               device: str | torch.device = "cpu", row_cap: int = PACK_ROW_TOKENS,
               quadratic: bool = True) -> PackedTrees:
    """Lay ``sequences`` out as trie rows; ``trained[b][t]`` marks the positions whose log-prob the
    loss reads (the sampled tokens). ``gather`` is ``[B, max length]``, aligned with
    :func:`~tracerl.train.update.pad_trajectories`. Built on the CPU, moved to ``device`` once.
    ``quadratic``: the dense mask's row rule (module docstring); off for ``flex`` attention."""
    if not sequences:
        raise ValueError("pack_trees needs at least one sequence")
    longest = max(len(s) for s in sequences)
    rows, placed = trie_rows(sequences, max(row_cap, longest), quadratic=quadratic)
    width = max(len(r.tokens) for r in rows)
    size = (len(rows), width)
    ids = torch.full(size, pad_id, dtype=torch.long)
    depth = torch.zeros(size, dtype=torch.long)
    end = torch.arange(1, width + 1).repeat(len(rows), 1)
    for r, row in enumerate(rows):
        n = len(row.tokens)
        ids[r, :n] = torch.tensor(row.tokens)
        depth[r, :n] = torch.tensor(row.depth)
        end[r, :n] = torch.tensor(row.end)
    node: dict[tuple[int, int], int] = {}
    sources: list[int] = []
    targets: list[int] = []
    gather = torch.zeros((len(sequences), longest), dtype=torch.long)
    for b, (seq, mask, (r, slots)) in enumerate(zip(sequences, trained, placed, strict=True)):
        for t in range(1, len(seq)):
            if not mask[t]:
                continue
            key = (r, slots[t])
            if key not in node:
                node[key] = len(sources)
                sources.append(r * width + slots[t - 1])
                targets.append(seq[t])
            gather[b, t] = node[key] + 1
    target = torch.device(device)
    return PackedTrees(ids.to(target), depth.to(target), end.to(target), torch.tensor(sources, dtype=torch.long,
                       device=target), torch.tensor(targets, dtype=torch.long, device=target), gather.to(target),
                       sum(len(r.tokens) for r in rows))


def packable(model: Any) -> bool:
    """Whether ``model``'s attention takes the custom 4D tree mask."""
    config = getattr(model, "config", None)
    return (getattr(config, "_attn_implementation", None) or "eager") in MASKABLE_ATTENTION


def packed_token_logprobs(model: Any, packed: PackedTrees, temperature: float, chunk: int,
                          attention: str = "dense") -> Tensor:
    """:func:`local_packed_logprobs`, through the model's FSDP forward method when it is sharded;
    ``attention = 'flex'``: :func:`flex_packed_logprobs` (unsharded only)."""
    args = (packed.input_ids, packed.position_ids, packed.end, packed.sources, packed.targets, packed.gather,
            temperature, chunk)
    sharded = getattr(model, FSDP_PACKED_LOGPROBS, None)
    if attention == "flex":
        if sharded is not None:
            raise ValueError("optim.packed_attention = 'flex' does not run with a sharded model (dist); use 'dense'")
        return flex_packed_logprobs(model, *args)
    if sharded is not None:
        return sharded(*args)
    return local_packed_logprobs(model, *args)


def _mask_dtype(device: torch.device, model: Any) -> torch.dtype:
    """The dtype the attention scores run in: the autocast dtype inside autocast, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def local_packed_logprobs(model: Any, input_ids: Tensor, position_ids: Tensor, end: Tensor, sources: Tensor,
                          targets: Tensor, gather: Tensor, temperature: float, chunk: int) -> Tensor:
    """log p(token_t | tokens_<t) at ``temperature`` for every sequence position the packing
    marked, [B, L] float32 (0 elsewhere), from one tree-masked forward of the ``[R, P]`` rows.

    As :func:`~tracerl.train.update.local_token_logprobs`: the decoder runs once, then the LM head
    and log-softmax run ``chunk`` needed nodes at a time (checkpointed when gradients are on).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score log-probs, got {temperature}")
    mask = tree_attention_mask(end, _mask_dtype(input_ids.device, model))
    return masked_logprobs(model, mask, input_ids, position_ids, sources, targets, gather, temperature, chunk)


def flex_packed_logprobs(model: Any, input_ids: Tensor, position_ids: Tensor, end: Tensor, sources: Tensor,
                         targets: Tensor, gather: Tensor, temperature: float, chunk: int) -> Tensor:
    """:func:`local_packed_logprobs` with the tree rule as a block mask (:mod:`tracerl.train.flex_packing`)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score log-probs, got {temperature}")
    if torch.is_grad_enabled() and input_ids.device.type != "cuda":
        raise ValueError(f"optim.packed_attention = 'flex' needs CUDA to train (got {input_ids.device.type!r}): torch "
                         "has no FlexAttention backward on CPU; use optim.packed_attention = 'dense'")
    with flex_scope(model):
        return masked_logprobs(model, tree_block_mask(end), input_ids, position_ids, sources, targets, gather,
                               temperature, chunk)


def masked_logprobs(model: Any, mask: Any, input_ids: Tensor, position_ids: Tensor, sources: Tensor,
                    targets: Tensor, gather: Tensor, temperature: float, chunk: int) -> Tensor:
    """The packed forward and the needed nodes' log-probs under ``mask`` (a 4D float mask, or a
    ``BlockMask`` when the model's attention is flex)."""
    split = split_head(model)
    if split is None:
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
        flat_logits = logits.reshape(-1, logits.shape[-1])[sources].float()
        picked = torch.log_softmax(flat_logits / temperature, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    else:
        decoder, head = split
        hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        flat = hidden.reshape(-1, hidden.shape[-1])[sources]
        picked = chunked_head_logprobs(flat, targets, head, logit_transform(model.config), temperature, chunk)
    values = torch.cat([picked.new_zeros(1), picked])
    return values[gather]
