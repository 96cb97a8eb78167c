"""Which batch scorer readiness goes through, by ``+tracerl.readiness`` (``in_process``,
``reference_worker``, ``reference_server``): :func:`readiness_scorer` builds the manager's
``ReferenceScorer`` over it and :func:`connect_reference` hands a server scorer verl's
``teacher_client``. Apart from :mod:`.readiness` and :mod:`.reference`, which it joins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tracerl.errors import UserError
from tracerl.integrations.verl.readiness import (
    InProcessReadiness,
    ReadinessScorer,
    RoutedReferenceScorer,
    ServerReference,
)
from tracerl.integrations.verl.reference import VerlReference
from tracerl.models.scoring import ReferenceScorer


def readiness_scorer(mode: str, model: Any, tokenizer: Any, fmt: Any, *, answer_prefix: str = "",
                     dtype: torch.dtype | None = None, timeout_s: float | None = None,
                     check: Any = None) -> tuple[ReferenceScorer, ReadinessScorer]:
    """The manager's ``ReferenceScorer`` for ``+tracerl.readiness = mode`` and the batch scorer
    under it (whose counters the manager logs). ``model``: the HF reference (``in_process``) or
    None; ``check``: the HF copy every call is compared with (the other modes)."""
    if mode == "in_process":
        local = InProcessReadiness()
        return ReferenceScorer(model, tokenizer, fmt, answer_prefix=answer_prefix, dtype=dtype, batch_scorer=local), local
    if mode == "reference_worker":
        worker = VerlReference(check=check)
        return ReferenceScorer(None, tokenizer, fmt, batch_scorer=worker, answer_prefix=answer_prefix), worker
    if mode == "reference_server":
        server = ServerReference(check=check, timeout_s=timeout_s)
        return RoutedReferenceScorer(None, tokenizer, fmt, batch_scorer=server, answer_prefix=answer_prefix), server
    raise UserError(f"tracerl.readiness = {mode!r} is not valid; allowed values: in_process, reference_worker, "
                    "reference_server")


def connect_reference(scorer: Any, teacher_client: Mapping[str, Any] | None) -> None:
    """Give a :class:`ServerReference` verl's ``teacher_client`` (refused in one line without its
    servers); other scorers need nothing."""
    if isinstance(scorer, ServerReference):
        scorer.connect(teacher_client)
