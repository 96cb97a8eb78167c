"""Readiness on verl's reference worker (``+tracerl.readiness=reference_worker``).

TRACE credit scores how predictable the gold answer is after each turn boundary under the frozen
reference: ``l_k`` = the mean log-probability of the answer tokens after ``S_k`` and the format's
answer opener. Inside verl the frozen reference already lives in verl's reference worker (on the
actor's GPUs in production), so instead of a second copy in the trainer's process,
:class:`VerlReference` turns the manager's scoring jobs into rows ``prompt = S_k + opener``,
``response = answer`` and sends them, once per distinct row, through verl's own reference
log-prob path (``compute_ref_log_prob``, or the actor with its adapter off when the reference
lives in the actor) at temperature 1; the ``tracerl_sync`` trainer provides that call
(:meth:`~.trainer.TraceSyncTrainer.reference_logprobs`).

It is a :data:`~tracerl.models.scoring.BatchScorer`, so tracerl's ``ReferenceScorer`` batches a
step's boundaries into it exactly as it batches them into its own HF forwards. With ``check`` (an
HF model of the same checkpoint, ``+tracerl.check=true``) every call is also scored in process and
the largest difference is kept in :attr:`VerlReference.max_gap`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tracerl.errors import UserError

Rows = list[tuple[tuple[int, ...], tuple[int, ...]]]
"""``(prompt_ids, response_ids)`` rows."""


class VerlReference:
    """A batch scorer over verl's reference worker (module docstring)."""

    def __init__(self, check: Any = None) -> None:
        self.compute: Callable[[Rows], list[torch.Tensor]] | None = None
        """``rows -> per-token log-probs of each row's response`` (set by the ``tracerl_sync`` trainer)."""
        self.check = check
        self.max_gap = 0.0
        """Largest ``|verl's readiness - the HF copy's|`` since the manager's step began."""
        self.rows = 0
        """Rows sent to verl's reference worker since the manager's step began."""

    def __call__(self, model: Any, requests: Sequence[Any], *, max_batch_tokens: int = 0,
                 stats: Any = None) -> list[torch.Tensor]:
        if self.compute is None:
            raise UserError("+tracerl.readiness=reference_worker scores on verl's reference worker, which the "
                            "tracerl_sync trainer hands over (trainer.v1.trainer_mode=tracerl_sync)")
        slots, index = [], {}
        for req in requests:
            for cut in req.cut_points:
                row = (tuple(req.input_ids[:cut]) + tuple(req.opener_ids), tuple(req.answer_ids))
                slots.append(index.setdefault(row, len(index)))
        logprobs = self.compute(list(index))
        means = [lp.float().mean() for lp in logprobs]
        self.rows += len(index)
        out, at = [], 0
        for req in requests:
            out.append(torch.stack([means[slots[at + j]] for j in range(len(req.cut_points))]).float())
            at += len(req.cut_points)
        if self.check is not None:
            from tracerl.models.batched_scoring import score_prefixes_batched

            want = score_prefixes_batched(self.check, list(requests))
            gaps = [float((a - b).abs().max()) for a, b in zip(out, want, strict=True) if a.numel()]
            self.max_gap = max([self.max_gap, *gaps])
        return out
