"""The plain PyTorch pretraining loop of the tiny base model (AdamW, warmup + cosine LR).

Rows are whole episodes or document rows (never cut mid-episode, so every assistant turn
sees its prompt), padded on the right per batch. Logits are computed only where a token
carries loss, which saves the LM head on padding (and on observations with
``loss_on="assistant"``).
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tracerl.models.tiny_config import TinyModelConfig, resolve_precision
from tracerl.models.tiny_data import Sample


@dataclass
class TrainLog:
    """What a pretraining run reports (written next to the model as ``pretrain_log.json``)."""

    losses: list[float] = field(default_factory=list)
    """Mean token loss of each optimiser step."""
    tokens: int = 0
    """Tokens in all batches (padding excluded)."""
    seconds: float = 0.0
    precision: str = "float32"


def lr_at(step: int, config: TinyModelConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    ratio = config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * ratio


def collate(rows: list[Sample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [B, L], attention_mask [B, L], labels [B, L])``; labels are -100 without loss.

    ``labels[b, t]`` is the target for position ``t`` (already shifted: the token at ``t + 1``).
    """
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, row in enumerate(rows):
        n = len(row.ids)
        ids[b, :n] = torch.tensor(row.ids, dtype=torch.long)
        attn[b, :n] = 1
        targets = torch.tensor(row.ids[1:], dtype=torch.long)
        keep = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
        labels[b, : n - 1] = torch.where(keep, targets, torch.full_like(targets, -100))
    return ids, attn, labels


def batch_loss(model: Any, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions with a label (LM head applied there only)."""
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    where = labels != -100
    logits = model.lm_head(hidden[where])
    return F.cross_entropy(logits.float(), labels[where])


def train_causal_lm(model: Any, samples: list[Sample], config: TinyModelConfig, pad_id: int,
                    progress: bool = True) -> TrainLog:
    """Train ``model`` in place for ``config.steps`` steps of ``config.batch_size`` rows."""
    if not samples:
        raise ValueError("train_causal_lm needs at least one sample")
    rng = random.Random(f"tiny-batches:{config.seed}")
    precision = resolve_precision(config.precision)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=config.lr, betas=(0.9, 0.95), eps=1e-8)
    log = TrainLog(precision=precision)
    order: list[int] = []
    start = time.perf_counter()
    model.train()
    for step in range(config.steps):
        if len(order) < config.batch_size:
            fresh = list(range(len(samples)))
            rng.shuffle(fresh)
            order += fresh
        rows = [samples[i] for i in order[: config.batch_size]]
        del order[: config.batch_size]
        ids, attn, labels = collate(rows, pad_id)
        for group in optim.param_groups:
            group["lr"] = lr_at(step, config)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            loss = batch_loss(model, ids, attn, labels)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optim.step()
        log.losses.append(float(loss.detach()))
        log.tokens += int(attn.sum())
        if progress and (step % 50 == 0 or step == config.steps - 1):
            elapsed = time.perf_counter() - start
            print(f"pretrain step {step + 1}/{config.steps} loss {log.losses[-1]:.3f} "
                  f"({log.tokens / max(elapsed, 1e-9):.0f} tok/s)", file=sys.stderr, flush=True)
    model.eval()
    log.seconds = time.perf_counter() - start
    return log
