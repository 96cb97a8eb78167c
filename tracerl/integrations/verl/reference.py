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

Each node is a row of its own, forwarded in full: verl's engine forwards every row causally (packed
rows attend only within themselves) and computes log-probs at every token, so rows that share a
tree's prefix cannot share its forward there, and the LM head runs over the whole row
(``readiness_tokens_forwarded`` = ``readiness_tokens_full_prefix``). Shared prefixes forwarded once
with only the gold tokens projected is tracerl's own forward (``in_process``); off the actor's
memory, ``reference_server`` (:mod:`.readiness`).

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
from tracerl.integrations.verl.readiness import ReadinessScorer, Row, per_request
from tracerl.models.batched_scoring import ScoreStats
from tracerl.models.scoring_plan import ScoreRequest

Rows = list[Row]
"""``(prompt_ids, response_ids)`` rows."""


class VerlReference(ReadinessScorer):
    """A batch scorer over verl's reference worker (module docstring). verl's engine forwards each
    row in full and projects every token of it, so ``readiness_tokens_forwarded`` and
    ``readiness_head_tokens`` are the rows' full length (:class:`~.readiness.ReadinessScorer`)."""

    def __init__(self, check: Any = None) -> None:
        super().__init__(check)
        self.compute: Callable[[Rows], list[torch.Tensor]] | None = None
        """``rows -> per-token log-probs of each row's response`` (set by the ``tracerl_sync`` trainer)."""

    def score(self, model: Any, requests: Sequence[ScoreRequest], rows: Rows, slots: list[int],
              max_batch_tokens: int, stats: ScoreStats) -> list[torch.Tensor]:
        if self.compute is None:
            raise UserError("+tracerl.readiness=reference_worker scores on verl's reference worker, which the "
                            "tracerl_sync trainer hands over (trainer.v1.trainer_mode=tracerl_sync)")
        logprobs = self.compute(rows)
        full = sum(len(p) + len(a) for p, a in rows)
        self.readiness_tokens_forwarded += full
        self.readiness_head_tokens += full
        return per_request(requests, slots, [float(lp.float().mean()) for lp in logprobs])
