"""The plain PyTorch pretraining loop of the tiny base model (AdamW, warmup + cosine LR).

Samples (whole episodes or document rows) are packed into rows of ``seq_len`` tokens with
positions restarting per sample, so each sample attends only to itself (as at inference)
and every batch has the same shape (CPU kernels, bf16 ones especially, are built per shape).
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

from tracerl.progress import clock, eta_seconds
from tracerl.testbed.tiny_config import TinyModelConfig, resolve_precision
from tracerl.testbed.tiny_data import Sample


@dataclass
class TrainLog:
    """What a pretraining run reports (written next to the model as ``pretrain_log.json``)."""

    losses: list[float] = field(default_factory=list)
    """Mean token loss of each optimiser step."""
    tokens: int = 0
    """Tokens in all batches (padding excluded)."""
    seconds: float = 0.0
    precision: str = "float32"
    device: str = "cpu"


def lr_at(step: int, config: TinyModelConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    ratio = config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * ratio


def pack_rows(lengths: list[int], order: list[int], seq_len: int, window: int = 16) -> list[list[int]]:
    """First-fit packing of samples (in ``order``) into rows of at most ``seq_len`` tokens.

    Only the last ``window`` rows stay open, which keeps packing linear in the sample count.
    Returns the sample indices of each row; a sample longer than ``seq_len`` is cut by
    :func:`collate`.
    """
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        need = min(lengths[i], seq_len)
        first = max(0, len(rows) - window)
        slot = next((r for r in range(first, len(rows)) if free[r] >= need), None)
        if slot is None:
            rows.append([i])
            free.append(seq_len - need)
        else:
            rows[slot].append(i)
            free[slot] -= need
    return rows


def collate(rows: list[list[Sample]], seq_len: int, pad_id: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, position_ids, labels, weights)``, each ``[len(rows), seq_len]``.

    Samples packed in one row restart their positions at 0; transformers then builds a
    block-diagonal causal mask, so each sample sees only itself, exactly as at inference.
    ``labels[b, t]`` is the target at position ``t`` (the next token) and ``weights[b, t]`` its
    loss weight (0 across sample boundaries and on padding).
    A fixed shape keeps CPU kernels from being rebuilt every step.
    """
    ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), seq_len), dtype=torch.long)
    labels = torch.zeros((len(rows), seq_len), dtype=torch.long)
    weights = torch.zeros((len(rows), seq_len), dtype=torch.float32)
    for b, row in enumerate(rows):
        at = 0
        for sample in row:
            n = min(len(sample.ids), seq_len - at)
            chunk = torch.tensor(sample.ids[:n], dtype=torch.long)
            ids[b, at : at + n] = chunk
            pos[b, at : at + n] = torch.arange(n)
            labels[b, at : at + n - 1] = chunk[1:]
            weights[b, at : at + n - 1] = torch.tensor(sample.weights[1:n], dtype=torch.float32)
            at += n
        pos[b, at:] = torch.arange(seq_len - at)  # the padding tail is a sequence of its own
    return ids, pos, labels, weights


def batch_loss(model: Any, ids: torch.Tensor, pos: torch.Tensor, labels: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean next-token cross-entropy: ``sum(w * ce) / sum(w)``."""
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    w = weights.flatten()
    return (ce * w).sum() / w.sum().clamp(min=1e-8)


def pretrain_device() -> str:
    """``cuda`` where a GPU is visible, else ``cpu``: the same command pretrains on either."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def train_causal_lm(model: Any, samples: list[Sample], config: TinyModelConfig, pad_id: int,
                    progress: bool = True, device: str | None = None) -> TrainLog:
    """Train ``model`` in place for ``config.steps`` steps of ``config.batch_size`` packed rows.

    Runs on ``device`` (default :func:`pretrain_device`) and leaves the model on the CPU, where
    it is saved and cached. bfloat16 autocast applies on either device type.
    """
    if not samples:
        raise ValueError("train_causal_lm needs at least one sample")
    device = device or pretrain_device()
    model.to(device)
    rng = random.Random(f"tiny-batches:{config.seed}")
    precision = resolve_precision(config.precision)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=config.lr, betas=(0.9, 0.95), eps=1e-8)
    log = TrainLog(precision=precision, device=torch.device(device).type)
    lengths = [len(s.ids) for s in samples]
    queue: list[list[int]] = []
    start = time.perf_counter()
    model.train()
    for step in range(config.steps):
        while len(queue) < config.batch_size:  # a new epoch: reshuffle and repack
            order = list(range(len(samples)))
            rng.shuffle(order)
            queue += pack_rows(lengths, order, config.seq_len)
        rows = [[samples[i] for i in row] for row in queue[: config.batch_size]]
        del queue[: config.batch_size]
        ids, pos, labels, weights = (t.to(device) for t in collate(rows, config.seq_len, pad_id))
        for group in optim.param_groups:
            group["lr"] = lr_at(step, config)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            loss = batch_loss(model, ids, pos, labels, weights)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optim.step()
        log.losses.append(float(loss.detach()))
        log.tokens += sum(min(len(x.ids), config.seq_len) for row in rows for x in row)
        if progress and (step % 50 == 0 or step == config.steps - 1):
            elapsed = time.perf_counter() - start
            eta = eta_seconds(elapsed, step + 1, config.steps - step - 1)
            print(f"pretrain step {step + 1}/{config.steps} loss {log.losses[-1]:.3f} "
                  f"({log.tokens / max(elapsed, 1e-9):.0f} tok/s) {clock(elapsed)} elapsed, ETA {clock(eta)}",
                  file=sys.stderr, flush=True)
    model.eval()
    model.to("cpu")
    log.seconds = time.perf_counter() - start
    return log
