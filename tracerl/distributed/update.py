"""The policy update over FSDP2 ranks: one global plan, equal forwards, reduced metrics.

The driver (rank 0) holds the step's trajectories. :func:`plan_update` cuts them into the same
micro-batches as the one-process update (:func:`tracerl.train.update.policy_update`) and deals
them to the ranks (:func:`tracerl.core.microbatch.deal_rounds`), with the step's normaliser
computed once over *all* rows. Each rank then runs :func:`sharded_policy_update` on its share:

* every rank runs the same number of forwards (empty rounds are a zero-weight padding row), so
  no rank waits in a collective the others never enter;
* each rank's loss is divided by ``normaliser / world``: FSDP averages gradients over ranks, so the
  summed gradient equals the one-process gradient (gloo has no PREMUL_SUM to sum instead);
* the gradient norm is a full tensor, and the loss and token sums are all-reduced, so every rank
  sees the same finite flag and all skip or step together.

torch.distributed is imported here, and this module only by the distributed path.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from tracerl.core.losses import loss_normaliser
from tracerl.core.microbatch import deal_rounds, micro_batch_rows
from tracerl.core.types import Trajectory
from tracerl.models.lora import trainable_parameters
from tracerl.models.precision import compute_context, model_device
from tracerl.train.update import (
    PaddedBatch,
    UpdateSettings,
    count_tokens,
    batch_logprobs,
    _micro_batch_loss,
    _replace_logprobs,
    carries_signal,
    order_key,
    pack_rows,
    pad_trajectories,
    uses_packing,
)

Row = tuple[Trajectory, Tensor]


@dataclass
class UpdateShare:
    """One rank's part of one optimiser step: ``rounds[r]`` are the rows of its r-th micro-batch
    (``[]``: a padding round); every rank of a step has the same number of rounds."""

    rounds: list[list[Row]]
    normaliser: float
    """The step's loss normaliser over all ranks' rows (:func:`~tracerl.core.losses.loss_normaliser`)."""
    world: int


def plan_update(trajectories: Sequence[Trajectory], advantages: Sequence[Tensor], settings: UpdateSettings,
                with_kl: bool, world: int) -> list[UpdateShare]:
    """The shares of one optimiser step, one per rank (index = rank).

    Rows are kept exactly as the one-process update keeps them (all with a KL term, otherwise
    those whose advantage is non-zero somewhere); the normaliser counts every row.
    """
    masks = [torch.tensor(t.sampled, dtype=torch.bool) for t in trajectories]
    normaliser = loss_normaliser(masks, settings.loss_agg, norm_length=max(len(m) for m in masks))
    keep = [(with_kl and settings.kl_coef > 0) or carries_signal(a) for a in advantages]
    keys = [order_key(t, settings.tree_packing != "never") for t in trajectories]
    chunks = micro_batch_rows(keys, keep, settings.micro_batch_size)
    plan = deal_rounds(chunks, world)
    rows = list(zip(trajectories, advantages, strict=True))
    return [UpdateShare([[rows[i] for i in chunk] for chunk in plan[rank]], normaliser, world)
            for rank in range(world)]


def padding_batch(pad_id: int, device: torch.device) -> PaddedBatch:
    """A [1, 2] row that trains no token: a padding round runs the collectives and adds nothing."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    zeros = torch.zeros((1, 2), device=device)
    return PaddedBatch(ids, torch.ones_like(ids), torch.zeros((1, 2), dtype=torch.bool, device=device), zeros,
                       zeros.clone())


def _batch(rows: list[Row], pad_id: int, device: torch.device) -> PaddedBatch:
    if not rows:
        return padding_batch(pad_id, device)
    return pad_trajectories([r[0] for r in rows], [r[1] for r in rows], pad_id, device)


def full_norm(norm: Tensor) -> Tensor:
    """The gradient norm as a plain tensor (a DTensor over sharded gradients is all-reduced first)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def sharded_policy_update(model: Any, optimizer: torch.optim.Optimizer, share: UpdateShare,
                          settings: UpdateSettings, pad_id: int, reference: Any | None = None) -> dict[str, float]:
    """One optimiser step of a sharded ``model`` over this rank's ``share``; every rank calls it.

    Returns the same metrics as :func:`~tracerl.train.update.policy_update`, equal on every rank
    (sums all-reduced). ``reference`` is a sharded frozen model (or None without a KL term).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    if not share.rounds:  # the plan is global: every rank has no round together
        return {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0,
                "nonfinite_skipped": 0.0}
    device = model_device(model)
    packing = uses_packing(model, settings)
    sums = torch.zeros(6, device=device)  # loss, kl token sum, clipped tokens, trained tokens, forwarded, unique
    for rows in share.rounds:
        batch = _batch(rows, pad_id, device)
        packed = pack_rows([r[0] for r in rows], pad_id, device) if packing and rows else None
        loss, stats = _micro_batch_loss(model, batch, settings, share.normaliser / share.world, reference, packed)
        loss.backward()
        tokens = count_tokens([r[0] for r in rows], packed)
        sums += torch.cat([loss.detach()[None], stats, torch.tensor(tokens, dtype=sums.dtype, device=device)])
    params = trainable_parameters(model)
    norm = full_norm(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip))
    dist.all_reduce(sums)
    sums[0] /= share.world  # each rank's loss was scaled by world (see the module docstring)
    loss_sum, kl_sum, clipped, tokens, forwarded, unique, grad_norm = torch.cat(
        [sums, norm.detach().float().reshape(1).to(device)]).tolist()
    finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    count = max(tokens, 1.0)
    return {"loss": loss_sum, "kl": kl_sum / count, "clip_fraction": clipped / count, "grad_norm": grad_norm,
            "trained_tokens": tokens, "update_forward_tokens": forwarded, "unique_trained_tokens": unique,
            "nonfinite_skipped": 0.0 if finite else 1.0, "scaler_skipped": 0.0}


@torch.no_grad()
def sharded_trainer_logprobs(model: Any, shares: Sequence[UpdateShare], settings: UpdateSettings,
                             pad_id: int) -> tuple[list[UpdateShare], dict[str, float]]:
    """The importance-sampling guard (:func:`~tracerl.train.update.with_trainer_logprobs`) over the
    same plan as the update: this rank's rows get the trainer's log-probs, one forward per round.

    The mismatch metrics are reduced over ranks; they cover the rows the update trains.
    """
    device, was_training = model_device(model), model.training
    packing = uses_packing(model, settings)
    model.eval()
    gap_sums = torch.zeros(2, device=device)  # |sampler - trainer| summed, tokens
    worst = torch.zeros(1, device=device)
    fresh_shares = []
    try:
        for share in shares:
            fresh_rounds = []
            for rows in share.rounds:
                batch = _batch(rows, pad_id, device)
                packed = pack_rows([r[0] for r in rows], pad_id, device) if packing and rows else None
                with compute_context(device, settings.dtype):
                    logprobs = batch_logprobs(model, batch, packed, settings).float()
                gap = (logprobs - batch.old_logprobs).abs() * batch.loss_mask
                gap_sums += torch.stack([gap.sum(), batch.loss_mask.sum().float()])
                worst = torch.maximum(worst, gap.max().reshape(1))
                values = logprobs.cpu().tolist()
                fresh_rounds.append([(_replace_logprobs(t, values[i][: len(t.token_ids)]), a)
                                     for i, (t, a) in enumerate(rows)])
            fresh_shares.append(dataclasses.replace(share, rounds=fresh_rounds))
    finally:
        model.train(was_training)
    dist.all_reduce(gap_sums)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    total, count = gap_sums.tolist()
    return fresh_shares, {"logprob_mismatch_mean_abs": total / max(count, 1.0),
                          "logprob_mismatch_max": float(worst.item())}
