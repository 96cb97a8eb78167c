"""``tracerl_sync``: verl 0.9.1's sync trainer whose advantage step hands the tree fields to
tracerl's estimators.

verl's v1 advantage step reads a fixed list of fields from TransferQueue and calls the estimator
with four arguments, so this trainer reads the tree fields (:data:`~.rows.TREE_FIELDS`) for the
same keys and opens :func:`~.estimators.tree_fields` around verl's own step; everything else is
verl's. verl reads the registered name as its trainer mode and tests it against ``"sync"`` in
several places, so the trainer sets its mode back to ``sync`` before the replay buffer is built.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from tracerl.integrations.verl.check import check_registrations
from tracerl.integrations.verl.estimators import tree_fields
from tracerl.integrations.verl.names import ESTIMATOR_NAMES, TRAINER_NAME
from tracerl.integrations.verl.rows import TREE_FIELDS, object_array


def _column(values: Any) -> Any:
    return object_array(values.tolist() if hasattr(values, "tolist") else list(values))


@register_trainer(TRAINER_NAME)
class TraceSyncTrainer(PPOTrainerSync):
    """verl's sync trainer; ``algorithm.adv_estimator=tracerl_trace_credit`` (or
    ``tracerl_tree_anchor``) reads the tree fields each leaf carries in TransferQueue."""

    def __init__(self, config: Any) -> None:
        check_registrations()
        super().__init__(config)

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = "sync"  # verl compares the mode with "sync"; this trainer is sync
        return super()._build_replay_buffer()

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        if self.config.algorithm.adv_estimator not in ESTIMATOR_NAMES:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(TREE_FIELDS))
        with tree_fields({name: _column(data[name]) for name in TREE_FIELDS}):
            return super()._compute_advantage(batch, metrics)
