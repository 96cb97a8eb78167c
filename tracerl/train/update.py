"""The policy update: clipped-PPO over micro-batches with one normaliser per optimiser step.

Math (surrogate, KL, aggregation) lives in :mod:`tracerl.core.losses`; this module only
batches trajectories into padded tensors, runs the model and steps the optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from tracerl.core.losses import aggregate_loss, clipped_surrogate_loss, k3_kl, loss_normaliser
from tracerl.core.types import Trajectory


@dataclass
class PaddedBatch:
    """Right-padded token ids with the per-token tensors the loss needs, shape [B, L]."""

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor


def pad_trajectories(trajectories: Sequence[Trajectory], advantages: Sequence[Tensor], pad_id: int) -> PaddedBatch:
    length = max(len(t.token_ids) for t in trajectories)
    size = (len(trajectories), length)
    ids = torch.full(size, pad_id, dtype=torch.long)
    attention = torch.zeros(size, dtype=torch.long)
    mask = torch.zeros(size, dtype=torch.bool)
    old = torch.zeros(size)
    adv = torch.zeros(size)
    for row, (traj, a) in enumerate(zip(trajectories, advantages)):
        tokens = traj.token_ids
        n = len(tokens)
        ids[row, :n] = torch.tensor(tokens)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(traj.sampled)
        old[row, :n] = torch.tensor(traj.old_logprobs)
        adv[row, :n] = a
    return PaddedBatch(ids, attention, mask, old, adv)


def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """log p(token_t | tokens_<t) at ``temperature`` for every position, [B, L] (0 at t = 0)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


@dataclass(frozen=True)
class UpdateSettings:
    micro_batch_size: int
    temperature: float
    clip_low: float
    clip_high: float
    kl_coef: float
    loss_agg: str
    grad_clip: float


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Tensor],
    settings: UpdateSettings,
    pad_id: int,
    reference: Any | None = None,
) -> dict[str, float]:
    """One optimiser step over ``trajectories`` with gradient accumulation over micro-batches."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    masks = [torch.tensor(t.sampled, dtype=torch.bool) for t in trajectories]
    # The normaliser counts every trajectory of the step, whichever micro-batch it lands in.
    normaliser = loss_normaliser(masks, settings.loss_agg, norm_length=max(len(m) for m in masks))
    totals = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "tokens": 0.0}
    for chunk in _micro_batches(trajectories, advantages, settings, reference is not None):
        batch = pad_trajectories([trajectories[i] for i in chunk], [advantages[i] for i in chunk], pad_id)
        logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask, settings.temperature)
        per_token = clipped_surrogate_loss(
            logprobs, batch.old_logprobs, batch.advantages, clip_low=settings.clip_low, clip_high=settings.clip_high
        )
        kl = torch.zeros_like(per_token)
        if reference is not None and settings.kl_coef > 0:
            with torch.no_grad():
                ref_logprobs = token_logprobs(reference, batch.input_ids, batch.attention_mask, settings.temperature)
            kl = k3_kl(logprobs, ref_logprobs)
            per_token = per_token + settings.kl_coef * kl
        loss = aggregate_loss(per_token, batch.loss_mask, settings.loss_agg, normaliser)
        loss.backward()
        with torch.no_grad():
            m = batch.loss_mask
            ratio = torch.exp(logprobs - batch.old_logprobs)
            clipped = ((ratio < 1 - settings.clip_low) | (ratio > 1 + settings.clip_high)) & m
            totals["loss"] += float(loss)
            totals["kl"] += float((kl * m).sum())
            totals["clip_fraction"] += float(clipped.sum())
            totals["tokens"] += float(m.sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    tokens = max(totals["tokens"], 1.0)
    return {
        "loss": totals["loss"],
        "kl": totals["kl"] / tokens,
        "clip_fraction": totals["clip_fraction"] / tokens,
        "grad_norm": float(grad_norm),
        "trained_tokens": totals["tokens"],
    }


def _micro_batches(trajectories: Sequence[Trajectory], advantages: Sequence[Tensor], settings: UpdateSettings,
                   with_kl: bool) -> list[list[int]]:
    """Indices to run, sorted by length (less padding), ``micro_batch_size`` at a time.

    Without a KL term, a trajectory whose advantages are all zero contributes exactly zero
    gradient (its surrogate is ``-ratio * 0``); it still counts in the normaliser but is not run.
    In GRPO-style batches that skips every all-success or all-failure group.
    """
    needs_kl = with_kl and settings.kl_coef > 0
    keep = [i for i, a in enumerate(advantages) if needs_kl or carries_signal(a)]
    keep.sort(key=lambda i: len(trajectories[i].token_ids))
    size = settings.micro_batch_size
    return [keep[i : i + size] for i in range(0, len(keep), size)]


def carries_signal(advantage: Tensor) -> bool:
    """Whether a row's advantage is non-zero anywhere; without KL, a row that is not is skipped."""
    return bool(advantage.abs().sum() > 0)
