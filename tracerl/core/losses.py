"""Per-token policy losses and their aggregation (spec section 2 step 8).

Policy losses (:data:`POLICY_LOSSES`, ``algo.policy_loss``):

* ``ppo``: :func:`clipped_surrogate_loss`, the token-level clipped PPO/GRPO surrogate.
* ``gspo``: :func:`gspo_surrogate_loss`, GSPO's sequence-level importance ratio (Zheng et al.,
  arXiv 2507.18071), with the per-sequence aggregation ``seq-mean-token-mean``.

The per-token terms (:func:`clipped_surrogate_loss`, :func:`k3_kl`) are kept apart from the
aggregation, and the aggregation's normaliser is computed *once per optimiser step* over all
micro-batches (:func:`loss_normaliser`). Each micro-batch then contributes
:func:`aggregate_loss` ``= sum(weighted per-token loss) / normaliser``, so summing the
micro-batch losses (gradient accumulation) gives exactly the whole-batch loss, whatever the
split. Modes:

* ``token-mean``: every trained token of the step weighs the same (DAPO).
* ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (GRPO paper).
* ``seq-mean-token-sum-norm``: per-sequence token sum divided by a constant ``norm_length``,
  averaged over sequences (Dr. GRPO: no length bias).

Sequences with no trained token (for example infra failures masked out by the trainer) do
not count as sequences in the ``seq-*`` modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tracerl.core.registry import Registry


def _same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch: {shapes}")


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> Tensor:
    """Per-token PPO/GRPO clipped surrogate to *minimise*, with DAPO clip-higher.

    ``ratio = exp(logprobs - old_logprobs)`` is clipped to ``[1 - clip_low, 1 + clip_high]``
    and the loss is ``-min(ratio * A, clip(ratio) * A)``. All inputs share one shape
    (``[B, L]`` or ``[L]``); the output has that shape. Tokens with ``A = 0`` (masked
    observation tokens) get exactly 0.
    """
    _check_clip(clip_low, clip_high)
    _same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    # An exact zero on zero-advantage tokens even if the ratio overflowed there.
    return torch.where(advantages == 0, torch.zeros_like(loss), loss)


def _as_rows(*tensors: Tensor) -> list[Tensor]:
    """``[L]`` inputs as one ``[1, L]`` sequence; ``[B, L]`` unchanged; anything else is an error."""
    if tensors[0].dim() not in (1, 2):
        raise ValueError(f"GSPO inputs must be [B, L] (or [L]), got shape {tuple(tensors[0].shape)}")
    return [t.unsqueeze(0) if t.dim() == 1 else t for t in tensors]


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's ``log s_i = (1/|y_i|) sum_t (logprobs - old_logprobs)`` over each row's trained tokens.

    ``[B, L]`` (or ``[L]``) inputs, ``mask`` selecting the sampled tokens (observation and prompt
    tokens are not part of the "sequence" ``y_i`` of a multi-turn trajectory). Returns ``[B]``
    (``[1]`` for ``[L]``); a row without trained tokens gets 0 (ratio 1). Masked positions never
    enter, even when they hold NaN or inf.
    """
    _same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask)
    lp, old, m = _as_rows(logprobs, old_logprobs, mask)
    m = m.bool()
    diff = torch.where(m, lp - old, torch.zeros_like(lp))
    return diff.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(diff.dtype)


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not (0.0 <= clip_low < 1.0):
        raise ValueError(f"clip_low must lie in [0, 1), got {clip_low!r}")
    if not (math.isfinite(clip_high) and clip_high >= 0.0):
        raise ValueError(f"clip_high must be a finite number >= 0, got {clip_high!r}")


def gspo_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> Tensor:
    """Per-token form of GSPO's clipped sequence-level surrogate, to *minimise*.

    GSPO (arXiv 2507.18071) maximises ``(1/G) sum_i min(s_i A_i, clip(s_i, 1-eps_l, 1+eps_h) A_i)``
    with ``s_i = exp(sequence_log_ratio)`` and the paper's clip range ``eps_l = 3e-4``,
    ``eps_h = 4e-4``. This returns its GSPO-token form: token t of row i holds
    ``-min(r_it A_it, clip(r_it) A_it)`` with ``r_it = sg[s_i] * exp(lp_it - sg[lp_it])``, which
    has the value ``s_i`` and the gradient ``s_i * grad lp_it``. Aggregated with
    ``seq-mean-token-mean`` (mean over sequences of the token mean) and a sequence-level
    advantage (``A_it = A_i``, as ``grpo`` gives), value and gradient equal GSPO's exactly; with
    token-varying advantages it is the paper's GSPO-token.

    Shapes: all inputs ``[B, L]`` (or ``[L]``); returns that shape. Tokens with ``A = 0`` (masked
    observation tokens) get exactly 0.
    """
    _check_clip(clip_low, clip_high)
    _same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    seq = sequence_log_ratio(logprobs, old_logprobs, mask).exp()  # [B]
    lp, adv = _as_rows(logprobs, advantages)
    ratio = seq.detach().unsqueeze(1) * torch.exp(lp - lp.detach())
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    loss = torch.where(adv == 0, torch.zeros_like(loss), loss)
    return loss if logprobs.dim() == 2 else loss.squeeze(0)


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, float, float], tuple[Tensor, Tensor]]
"""``(logprobs, old_logprobs, advantages, mask, clip_low, clip_high) -> (per-token loss,
detached ratio the clip acts on)``, all ``[B, L]``; the ratio feeds the clip-fraction metric."""


def _ppo_loss(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    loss = clipped_surrogate_loss(lp, old, adv, clip_low=low, clip_high=high)
    return loss, torch.exp(lp - old).detach()


def _gspo_loss(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    loss = gspo_surrogate_loss(lp, old, adv, mask, clip_low=low, clip_high=high)
    ratio = sequence_log_ratio(lp, old, mask).detach().exp()
    return loss, ratio.unsqueeze(1).expand_as(loss) if loss.dim() == 2 else ratio.expand_as(loss)


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", accept_paths=False)
"""Policy losses by name (``algo.policy_loss``)."""
POLICY_LOSSES.add("ppo", _ppo_loss)
POLICY_LOSSES.add("gspo", _gspo_loss)
SEQUENCE_LEVEL_LOSSES = ("gspo",)
"""Losses defined per sequence: they need the ``seq-mean-token-mean`` aggregation."""


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(d) - d - 1`` with ``d = ref - lp``.

    Non-negative and unbiased for samples from pi; not clamped, so a blow-up is visible.
    """
    _same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


# ----------------------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class _Aggregation:
    normaliser: Callable[[list[Tensor], int | None], float]
    row_weights: Callable[[Tensor], Tensor]
    """``[B, L]`` mask -> ``[B, L]`` token weights (before dividing by the normaliser)."""


def _rows(mask: Tensor) -> Tensor:
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    if mask.dim() != 2:
        raise ValueError(f"loss masks must be [B, L] (or [L]), got shape {tuple(mask.shape)}")
    return mask.to(torch.float64)


def _active_rows(masks: list[Tensor]) -> int:
    return int(sum(int((m.sum(dim=1) > 0).sum()) for m in masks))


def _token_count(masks: list[Tensor], _: int | None) -> float:
    return float(sum(float(m.sum()) for m in masks))


def _seq_count(masks: list[Tensor], _: int | None) -> float:
    return float(_active_rows(masks))


def _seq_norm(masks: list[Tensor], norm_length: int | None) -> float:
    if norm_length is None:
        raise ValueError("mode 'seq-mean-token-sum-norm' needs norm_length (e.g. max total tokens)")
    return float(_active_rows(masks) * norm_length)


def _per_row_mean(mask: Tensor) -> Tensor:
    length = mask.sum(dim=1, keepdim=True)
    return mask / length.clamp(min=1.0)


AGGREGATIONS: Registry[_Aggregation] = Registry("loss aggregation", accept_paths=False)
"""Loss aggregations by name (internal pairs of normaliser and row weighting: no import paths)."""
AGGREGATIONS.add("token-mean", _Aggregation(_token_count, lambda m: m))
AGGREGATIONS.add("seq-mean-token-mean", _Aggregation(_seq_count, _per_row_mean))
AGGREGATIONS.add("seq-mean-token-sum-norm", _Aggregation(_seq_norm, lambda m: m))


def available_aggregations() -> list[str]:
    return AGGREGATIONS.names()


def _get_aggregation(mode: str) -> _Aggregation:
    return AGGREGATIONS.get(mode)


def loss_normaliser(masks: Sequence[Tensor], mode: str, *, norm_length: int | None = None) -> float:
    """The step's normaliser over *all* its micro-batch masks (each ``[B_i, L_i]`` or ``[L]``).

    ``token-mean``: trained tokens; ``seq-mean-token-mean``: sequences with a trained token;
    ``seq-mean-token-sum-norm``: such sequences x ``norm_length``. 0.0 when nothing trains.
    """
    agg = _get_aggregation(mode)
    if norm_length is not None and (
        isinstance(norm_length, bool) or not isinstance(norm_length, int) or norm_length < 1
    ):
        raise ValueError(f"norm_length must be a positive integer, got {norm_length!r}")
    return agg.normaliser([_rows(m) for m in masks], norm_length)


def aggregate_loss(per_token: Tensor, mask: Tensor, mode: str, normaliser: float) -> Tensor:
    """This micro-batch's share of the step loss: ``sum(weights * per_token) / normaliser``.

    ``per_token`` and ``mask`` are ``[B, L]`` (or ``[L]``); the mask is the loss mask
    (``trajectory.sampled`` padded with False). A zero normaliser is allowed only when the
    mask is empty (the step trains nothing) and gives a zero loss that keeps the graph.
    """
    agg = _get_aggregation(mode)
    _same_shape(per_token=per_token, mask=mask)
    if not math.isfinite(normaliser) or normaliser < 0:
        raise ValueError(f"normaliser must be finite and >= 0, got {normaliser!r}")
    rows = _rows(mask)
    values = per_token if per_token.dim() == 2 else per_token.unsqueeze(0)
    weights = agg.row_weights(rows).to(values.dtype)
    # where(), not a product, so NaN/inf on masked-out tokens cannot leak into the loss.
    weighted = torch.where(rows > 0, values * weights, torch.zeros_like(values))
    if normaliser == 0:
        if bool(rows.any()):
            raise ValueError(
                "normaliser is 0 but the mask selects tokens; compute it over all masks"
            )
        return weighted.sum()
    return weighted.sum() / normaliser


def policy_loss_metrics(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> dict[str, float]:
    """Diagnostics over masked tokens: clip fraction, approximate KL(old || new), mean ratio."""
    _same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    m = mask.bool()
    count = int(m.sum())
    if count == 0:
        return {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}
    with torch.no_grad():
        log_ratio = (logprobs - old_logprobs)[m].double()
        ratio = log_ratio.exp()
        adv = advantages[m].double()
        clipped_high = (ratio > 1.0 + clip_high) & (adv > 0)
        clipped_low = (ratio < 1.0 - clip_low) & (adv < 0)
        return {
            "clip_fraction": float((clipped_high | clipped_low).double().mean()),
            "approx_kl": float((ratio - 1.0 - log_ratio).mean()),
            "ratio_mean": float(ratio.mean()),
        }
