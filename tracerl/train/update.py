"""The policy update: a clipped surrogate (``ppo`` or ``gspo``) over micro-batches with one
normaliser per optimiser step.

Math (surrogates, KL, aggregation) lives in :mod:`tracerl.core.losses`; this module only
batches trajectories into padded tensors on the model's device, runs the model under the
working precision and steps the optimiser.

Precision: parameters and AdamW state are float32 master copies; forwards run under
:func:`~tracerl.models.precision.compute_context` (bf16/fp16 autocast), backward runs outside
it, and log-softmax, log-probs and the loss are float32. Host syncs: one per optimiser step
(the metrics and the finite check are read together at the end), none inside the micro-batch loop.
"""

from __future__ import annotations

import math
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

import torch
from torch import Tensor

from tracerl.core.losses import POLICY_LOSSES, aggregate_loss, k3_kl, loss_normaliser
from tracerl.core.types import Trajectory
from tracerl.models.heads import chunked_head_logprobs, logit_transform, split_head
from tracerl.models.lora import trainable_parameters
from tracerl.models.precision import compute_context, model_device
from tracerl.train.packing import PackedTrees, pack_trees, packable, packed_token_logprobs

if TYPE_CHECKING:
    from tracerl.config.schema import TrainConfig

LOGPROB_CHUNK = 1024
"""Positions per lm_head chunk: at Qwen3's 151,936-token vocabulary one chunk's fp32 logits are
~0.6 GB, whatever the micro-batch size (the full [B, L, V] tensor at 32 x 4,096 would be ~80 GB)."""


@dataclass
class PaddedBatch:
    """Right-padded token ids with the per-token tensors the loss needs, shape [B, L]."""

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor


def pad_trajectories(trajectories: Sequence[Trajectory], advantages: Sequence[Tensor], pad_id: int,
                     device: str | torch.device = "cpu") -> PaddedBatch:
    """Pad ``trajectories`` to one [B, L] batch on ``device``.

    The rows are filled on the CPU (they start as Python lists) and the five tensors move to
    ``device`` once, from pinned memory with ``non_blocking`` on CUDA so the copy overlaps.
    """
    length = max(len(t.token_ids) for t in trajectories)
    size = (len(trajectories), length)
    ids = torch.full(size, pad_id, dtype=torch.long)
    attention = torch.zeros(size, dtype=torch.long)
    mask = torch.zeros(size, dtype=torch.bool)
    old = torch.zeros(size)
    adv = torch.zeros(size)
    for row, (traj, a) in enumerate(zip(trajectories, advantages, strict=True)):
        n = len(traj.token_ids)
        ids[row, :n] = torch.tensor(traj.token_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(traj.sampled)
        old[row, :n] = torch.tensor(traj.old_logprobs)
        adv[row, :n] = a.detach().to("cpu", torch.float32)
    target = torch.device(device)
    pin = target.type == "cuda"

    def move(t: Tensor) -> Tensor:
        return (t.pin_memory() if pin else t).to(target, non_blocking=pin)

    return PaddedBatch(move(ids), move(attention), move(mask), move(old), move(adv))


def _full_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """Fallback for models without ``get_decoder``/``get_output_embeddings``: full [B, L-1, V] logits."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


FSDP_LOGPROBS = "tracerl_token_logprobs"
"""Name of the FSDP-registered forward method a sharded model carries (distributed/fsdp.py): calling
its decoder directly would leave the root's parameters (embeddings, norm, head) sharded."""


def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, temperature: float,
                   chunk: int = LOGPROB_CHUNK) -> Tensor:
    """:func:`local_token_logprobs`, through the model's FSDP forward method when it is sharded."""
    sharded = getattr(model, FSDP_LOGPROBS, None)
    if sharded is not None:
        return sharded(input_ids, attention_mask, temperature, chunk)
    return local_token_logprobs(model, input_ids, attention_mask, temperature, chunk)


def local_token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, temperature: float,
                         chunk: int = LOGPROB_CHUNK) -> Tensor:
    """log p(token_t | tokens_<t) at ``temperature`` for every position, [B, L] float32 (0 at t = 0).

    The decoder runs once to hidden states [B, L, H]; ``lm_head`` + log-softmax + gather then run
    over ``chunk`` positions at a time, each chunk under activation checkpointing when gradients
    are on, so neither forward nor backward holds more than one chunk's [chunk, V] logits.
    Works for plain Hugging Face causal LMs and peft-wrapped ones (both expose ``get_decoder``
    and ``get_output_embeddings``; LoRA layers sit inside the decoder modules).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score log-probs, got {temperature} "
                         "(rollout.engine.temperature = 0 is greedy decoding; train with a positive temperature)")
    split = split_head(model)
    if split is None:
        picked = _full_logprobs(model, input_ids, attention_mask, temperature)
        return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
    decoder, head = split
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    batch, length = input_ids.shape
    flat_hidden = hidden[:, :-1].reshape(batch * (length - 1), hidden.shape[-1])
    flat_targets = input_ids[:, 1:].reshape(-1)
    picked = chunked_head_logprobs(flat_hidden, flat_targets, head, logit_transform(model.config), temperature,
                                   chunk).view(batch, length - 1)
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
    dtype: str = "float32"
    """Working precision of the forwards (``model.dtype``); weights and optimiser stay float32."""
    logprob_chunk: int = LOGPROB_CHUNK
    policy_loss: str = "ppo"
    """A name in :data:`~tracerl.core.losses.POLICY_LOSSES`; ``clip_low``/``clip_high`` are its clip range."""
    tree_packing: str = "never"
    """``always``: each micro-batch's trees forward once, packed (:mod:`tracerl.train.packing`);
    ``auto``: packed when the model's attention takes a tree mask; ``never``: every sequence alone."""
    packed_attention: str = "dense"
    """``optim.packed_attention``: the packed forward's dense 4D mask, or ``flex`` (:mod:`tracerl.train.flex_packing`)."""


TREE_PACKING_OFF_SCHEMES = ("chain", "dapo")
"""Schemes whose trajectories share no turn (only their prompt): ``optim.tree_packing = auto``
leaves them unpacked."""


def resolve_tree_packing(setting: str, scheme: str) -> str:
    """``optim.tree_packing`` for ``rollout.scheme``: ``auto`` is ``never`` for chain schemes."""
    return "never" if setting == "auto" and scheme in TREE_PACKING_OFF_SCHEMES else setting


def uses_packing(model: Any, settings: UpdateSettings) -> bool:
    """Whether this update packs trees; ``always`` with an attention that ignores 4D masks is an error."""
    if settings.tree_packing == "never":
        return False
    if packable(model) or settings.packed_attention == "flex":  # flex swaps the attention in itself
        return True
    if settings.tree_packing == "always":
        impl = getattr(model.config, "_attn_implementation", None)
        raise ValueError(f"optim.tree_packing = 'always' needs an attention implementation that takes a custom 4D "
                         f"mask (sdpa or eager), the model uses {impl!r}; set optim.tree_packing = 'auto' or 'never'")
    return False


def update_settings(cfg: TrainConfig) -> UpdateSettings:
    """The update's settings from a run config: GSPO clips at ``algo.gspo_clip_low/high``, PPO at
    ``optim.clip_low/high``."""
    o, algo = cfg.optim, cfg.algo
    gspo = algo.policy_loss == "gspo"
    low, high = (algo.gspo_clip_low, algo.gspo_clip_high) if gspo else (o.clip_low, o.clip_high)
    return UpdateSettings(o.micro_batch_size, cfg.rollout.engine.temperature, low, high, o.kl_coef, o.loss_agg,
                          o.grad_clip, dtype=cfg.model.dtype, policy_loss=algo.policy_loss,
                          tree_packing=resolve_tree_packing(o.tree_packing, cfg.rollout.scheme),
                          packed_attention=o.packed_attention)


def _reference_parts(reference: Any) -> tuple[Any, Callable[[], ContextManager[Any]]]:
    """``(model, frozen)`` of a :class:`~tracerl.models.scoring.ReferenceScorer` (its ``frozen()``
    disables a LoRA adapter) or of a plain frozen model (null context)."""
    if hasattr(reference, "frozen") and hasattr(reference, "model"):
        return reference.model, reference.frozen
    return reference, contextlib.nullcontext


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Tensor],
    settings: UpdateSettings,
    pad_id: int,
    reference: Any | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, float]:
    """One optimiser step over ``trajectories`` with gradient accumulation over micro-batches.

    ``reference`` (for the KL term) is a ReferenceScorer or a frozen model on the same device.
    ``scaler`` is the float16 loss scaler (None otherwise). If the summed loss or the gradient
    norm is not finite the gradients are dropped and the step is skipped
    (``nonfinite_skipped = 1.0``; the key is always present).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    device = model_device(model)
    masks = [torch.tensor(t.sampled, dtype=torch.bool) for t in trajectories]
    # The normaliser counts every trajectory of the step, whichever micro-batch it lands in.
    normaliser = loss_normaliser(masks, settings.loss_agg, norm_length=max(len(m) for m in masks))
    packing = uses_packing(model, settings)
    chunks = _micro_batches(trajectories, advantages, settings, reference is not None, packing)
    if not chunks:  # no row carries signal: nothing to run (and a GradScaler must not step without grads)
        return {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0,
                "update_forward_tokens": 0.0, "unique_trained_tokens": 0.0, "nonfinite_skipped": 0.0}
    sums = torch.zeros(4, device=device)  # loss, kl token sum, clipped tokens, trained tokens
    forwarded = unique = 0
    for chunk in chunks:
        rows = [trajectories[i] for i in chunk]
        batch = pad_trajectories(rows, [advantages[i] for i in chunk], pad_id, device)
        packed = pack_rows(rows, pad_id, device, settings.packed_attention) if packing else None
        with packed_scope(model, settings, packed):  # flex: forward and (re-computing) backward alike
            loss, stats = _micro_batch_loss(model, batch, settings, normaliser, reference, packed)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        sums += torch.cat([loss.detach()[None], stats])
        tokens = count_tokens(rows, packed)
        forwarded, unique = forwarded + tokens[0], unique + tokens[1]
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = trainable_parameters(model)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip) if params else torch.zeros((), device=device)
    loss_sum, kl_sum, clipped, tokens, norm = torch.cat([sums, grad_norm.detach().float().reshape(1).to(device)]).tolist()
    finite = math.isfinite(loss_sum) and math.isfinite(norm)
    # With a float16 loss scaler an inf gradient norm at a finite loss is an overflow of the scale:
    # the scaler skips that step and lowers the scale. That is routine, not a non-finite step.
    scaler_overflow = scaler is not None and math.isfinite(loss_sum) and not math.isfinite(norm)
    if finite:
        (scaler.step(optimizer) if scaler is not None else optimizer.step())
    else:
        optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.update()  # lowers the scale after an overflow; unscale_ recorded the inf check
    count = max(tokens, 1.0)
    return {
        "loss": loss_sum,
        "kl": kl_sum / count,
        "clip_fraction": clipped / count,
        "grad_norm": norm,
        "trained_tokens": tokens,
        "update_forward_tokens": float(forwarded),
        "unique_trained_tokens": float(unique),
        "nonfinite_skipped": 0.0 if (finite or scaler_overflow) else 1.0,
        "scaler_skipped": 1.0 if scaler_overflow else 0.0,
    }


@torch.no_grad()
def with_trainer_logprobs(model: Any, trajectories: Sequence[Trajectory], settings: UpdateSettings,
                          pad_id: int) -> tuple[list[Trajectory], dict[str, float]]:
    """Importance-sampling guard: copies of ``trajectories`` whose turns carry the training model's
    log-probs of the sampled tokens (the PPO ratio's old policy), and the sampler/trainer mismatch.

    The sampler's log-probs come from another engine (vLLM), precision or kernel; the update's
    ratio must compare the trainer's new log-probs with the trainer's own old ones, or the
    mismatch reads as policy change and gets clipped. Returns
    ``{"logprob_mismatch_mean_abs", "logprob_mismatch_max"}`` over sampled tokens (|sampler - trainer|).
    One no-grad forward per micro-batch, under the working precision.
    """
    device, was_training = model_device(model), model.training
    model.eval()  # as the sampler saw it (no dropout)
    try:
        fresh, metrics = _trainer_logprobs(model, trajectories, settings, pad_id, device)
    finally:
        model.train(was_training)
    return [_replace_logprobs(t, fresh[i]) for i, t in enumerate(trajectories)], metrics


def _trainer_logprobs(model: Any, trajectories: Sequence[Trajectory], settings: UpdateSettings, pad_id: int,
                      device: torch.device) -> tuple[dict[int, list[float]], dict[str, float]]:
    packing = uses_packing(model, settings)
    keys = [order_key(t, packing) for t in trajectories]
    order = sorted(range(len(trajectories)), key=lambda i: keys[i])
    fresh: dict[int, list[float]] = {}
    total, count, worst = 0.0, 0, 0.0
    for start in range(0, len(order), settings.micro_batch_size):
        rows = order[start : start + settings.micro_batch_size]
        part = [trajectories[i] for i in rows]
        batch = pad_trajectories(part, [torch.zeros(len(t.token_ids)) for t in part], pad_id, device)
        packed = pack_rows(part, pad_id, device, settings.packed_attention) if packing else None
        with compute_context(batch.input_ids.device, settings.dtype):
            logprobs = batch_logprobs(model, batch, packed, settings)
        gap = (logprobs - batch.old_logprobs).abs() * batch.loss_mask
        total += float(gap.sum())
        count += int(batch.loss_mask.sum())
        worst = max(worst, float(gap.max())) if gap.numel() else worst
        values = logprobs.float().cpu().tolist()
        for row, i in enumerate(rows):
            fresh[i] = values[row][: len(trajectories[i].token_ids)]
    return fresh, {"logprob_mismatch_mean_abs": total / max(count, 1), "logprob_mismatch_max": worst}


def _replace_logprobs(trajectory: Trajectory, logprobs: list[float]) -> Trajectory:
    """A copy of ``trajectory`` whose turns' ``logprobs`` are read from ``logprobs`` [L] (aligned with token_ids)."""
    turns, pos = [], len(trajectory.prompt_ids)
    for turn in trajectory.turns:
        n = len(turn.assistant_ids)
        turns.append(dataclasses.replace(turn, logprobs=logprobs[pos : pos + n]))
        pos += n + len(turn.observation_ids)
    return dataclasses.replace(trajectory, turns=turns)


def pack_rows(trajectories: Sequence[Trajectory], pad_id: int, device: str | torch.device,
              attention: str = "dense") -> PackedTrees:
    """One micro-batch's trajectories packed as trees, their sampled tokens marked for the loss
    (the dense mask's quadratic row rule only for ``attention = 'dense'``)."""
    return pack_trees([t.token_ids for t in trajectories], [t.sampled for t in trajectories], pad_id, device,
                      quadratic=attention == "dense")


def packed_scope(model: Any, settings: UpdateSettings, packed: PackedTrees | None) -> ContextManager[Any]:
    """:func:`~tracerl.train.flex_packing.flex_scope` for a flex-packed micro-batch, else nothing."""
    if packed is None or settings.packed_attention != "flex":
        return contextlib.nullcontext()
    from tracerl.train.flex_packing import flex_scope

    return flex_scope(model)


def count_tokens(rows: Sequence[Trajectory], packed: PackedTrees | None) -> tuple[int, int]:
    """``(tokens forwarded, distinct trained tokens)`` of one micro-batch: per leaf without packing."""
    if packed is not None:
        return packed.tokens, int(packed.targets.numel())
    return sum(len(t.token_ids) for t in rows), sum(sum(t.sampled) for t in rows)


def order_key(trajectory: Trajectory, packing: bool) -> Any:
    """Micro-batches are cut from rows sorted by this: length (less padding), or packed the token
    ids themselves (a tree's leaves sit together, next to those sharing most with them)."""
    return trajectory.token_ids if packing else len(trajectory.token_ids)


def batch_logprobs(model: Any, batch: PaddedBatch, packed: PackedTrees | None, settings: UpdateSettings) -> Tensor:
    """[B, L] log-probs of the batch's tokens: one packed tree forward, or the padded rows."""
    if packed is not None:
        return packed_token_logprobs(model, packed, settings.temperature, settings.logprob_chunk,
                                     settings.packed_attention)
    return token_logprobs(model, batch.input_ids, batch.attention_mask, settings.temperature, settings.logprob_chunk)


def _micro_batch_loss(model: Any, batch: PaddedBatch, settings: UpdateSettings, normaliser: float,
                      reference: Any | None, packed: PackedTrees | None = None) -> tuple[Tensor, Tensor]:
    """Aggregated loss of one micro-batch (a scalar to backward) and its detached statistics
    ``[kl summed over trained tokens, clipped tokens, trained tokens]``, all on the model's device.
    With ``packed`` the log-probs come from one tree-packed forward; the loss terms are the same."""
    compute = compute_context(batch.input_ids.device, settings.dtype)
    with compute:
        logprobs = batch_logprobs(model, batch, packed, settings)
    per_token, ratio = POLICY_LOSSES.get(settings.policy_loss)(
        logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask, settings.clip_low, settings.clip_high
    )
    kl = torch.zeros_like(per_token)
    if reference is not None and settings.kl_coef > 0:
        ref_model, frozen = _reference_parts(reference)
        with torch.no_grad(), frozen(), compute_context(batch.input_ids.device, settings.dtype):
            ref_logprobs = batch_logprobs(ref_model, batch, packed, settings)
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + settings.kl_coef * kl
    loss = aggregate_loss(per_token, batch.loss_mask, settings.loss_agg, normaliser)
    with torch.no_grad():
        m = batch.loss_mask  # the ratio the loss clips: per token (ppo) or per sequence (gspo)
        clipped = ((ratio < 1 - settings.clip_low) | (ratio > 1 + settings.clip_high)) & m
        stats = torch.stack([(kl * m).sum(), clipped.sum().float(), m.sum().float()])
    return loss, stats


def _micro_batches(trajectories: Sequence[Trajectory], advantages: Sequence[Tensor], settings: UpdateSettings,
                   with_kl: bool, packing: bool = False) -> list[list[int]]:
    """Indices to run, sorted by length (less padding), ``micro_batch_size`` at a time. Packed,
    sorted by token ids instead: a tree's leaves sit together, next to those sharing most with them.

    Without a KL term, a trajectory whose advantages are all zero contributes exactly zero
    gradient (its surrogate is ``-ratio * 0``); it still counts in the normaliser but is not run.
    In GRPO-style batches that skips every all-success or all-failure group.
    """
    needs_kl = with_kl and settings.kl_coef > 0
    keep = [i for i, a in enumerate(advantages) if needs_kl or carries_signal(a)]
    order = [order_key(t, packing) for t in trajectories]
    keep.sort(key=lambda i: order[i])
    size = settings.micro_batch_size
    return [keep[i : i + size] for i in range(0, len(keep), size)]


def carries_signal(advantage: Tensor) -> bool:
    """Whether a row's advantage is non-zero anywhere; without KL, a row that is not is skipped."""
    return bool(advantage.abs().sum() > 0)
