"""``tracerl_sync``: verl 0.9.1's sync trainer whose advantage step hands the tree fields to
tracerl's estimators.

verl's v1 advantage step reads a fixed list of fields from TransferQueue and calls the estimator
with four arguments, so this trainer reads the tree fields (:data:`~.rows.TREE_FIELDS`) for the
same keys and opens :func:`~.estimators.tree_fields` around verl's own step; everything else is
verl's. verl reads the registered name as its trainer mode and tests it against ``"sync"`` in
several places, so the trainer sets its mode back to ``sync`` before the replay buffer is built.

With :class:`~.manager.TraceAgentLoopManager` (any manager with ``save_state`` / ``load_state``),
the manager's state (the success predictor) is saved in verl's ``global_step_{n}/`` folder with
every checkpoint and loaded from the folder verl resumes from.
"""

from __future__ import annotations

import os
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from tracerl.integrations.verl.estimators import tree_fields
from tracerl.integrations.verl.names import ESTIMATOR_NAMES, TRAINER_NAME
from tracerl.integrations.verl.registrations import require_registrations
from tracerl.integrations.verl.rows import TREE_FIELDS, neutral_padding, object_array


def _column(values: Any) -> Any:
    return object_array(values.tolist() if hasattr(values, "tolist") else list(values))


def step_folder(trainer: Any, global_steps: int, resuming: bool = False) -> str:
    """verl's checkpoint folder of step ``global_steps`` (``resume_from_path`` when resuming from one)."""
    if resuming and trainer.get("resume_mode", "auto") == "resume_path" and trainer.get("resume_from_path"):
        return str(trainer.resume_from_path)
    root = str(trainer.default_local_dir)
    return os.path.join(root if os.path.isabs(root) else os.path.join(os.getcwd(), root), f"global_step_{global_steps}")


def advantage_gap(batch: Any, padding: list[bool], trees: list[Any], config: Any) -> tuple[float, float]:
    """Largest ``|verl's advantage - tracerl's|`` over the batch's tokens (each real leaf against
    tracerl's own estimator on the manager's trees, each padding row against 0), and the largest
    ``|advantage|`` of a real leaf (``+tracerl.check_advantages=true``; one TransferQueue read a step)."""
    import torch

    from tracerl.core.advantages import AdvantageBatch, get_estimator
    from tracerl.integrations.verl.estimators import options_from

    got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                          select_fields=["advantages", "response_mask", "tracerl_tree_id", "tracerl_node_path"])
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in trees for t in tree.trajectories.values()}
    real = [i for i, pad in enumerate(padding) if not pad]
    order = [leaves[(got["tracerl_tree_id"][i], list(got["tracerl_node_path"][i])[-1])] for i in real]
    name = ESTIMATOR_NAMES[str(config.algorithm.adv_estimator)]
    want = get_estimator(name)(AdvantageBatch(order, {t.tree_id: t for t in trees}), options_from(config.algorithm))
    advantages, masks = (got[k].to_padded_tensor(0) if getattr(got[k], "is_nested", False) else got[k]
                         for k in ("advantages", "response_mask"))
    gap = max((float(advantages[i].abs().max()) for i, pad in enumerate(padding) if pad), default=0.0)
    largest = max((float(a.abs().max()) for a in want if a.numel()), default=0.0)
    for i, traj, adv in zip(real, order, want, strict=True):
        expected = adv[len(traj.prompt_ids):].float()
        sampled = torch.tensor(traj.sampled[len(traj.prompt_ids):], dtype=torch.bool)
        if not torch.equal(masks[i][: expected.numel()].bool(), sampled):
            raise ValueError(f"row {i}: response_mask is not the leaf's sampled mask")
        row = advantages[i].float()
        gap = max(gap, float((row[: expected.numel()] - expected).abs().max()),
                  float(row[expected.numel():].abs().max()) if row.numel() > expected.numel() else 0.0)
    return gap, largest


@register_trainer(TRAINER_NAME)
class TraceSyncTrainer(PPOTrainerSync):
    """verl's sync trainer; ``algorithm.adv_estimator=tracerl_trace_credit`` (or
    ``tracerl_tree_anchor``) reads the tree fields each leaf carries in TransferQueue."""

    def __init__(self, config: Any) -> None:
        require_registrations()
        super().__init__(config)

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = "sync"  # verl compares the mode with "sync"; this trainer is sync
        return super()._build_replay_buffer()

    def _load_checkpoint(self) -> Any:
        out = super()._load_checkpoint()
        self._tracerl_resume = step_folder(self.config.trainer, self.global_steps, resuming=True) if self.global_steps > 0 else None
        return out

    def fit(self, agent_loop_manager: Any) -> Any:
        resume = getattr(self, "_tracerl_resume", None)
        if resume is not None and callable(getattr(agent_loop_manager, "load_state", None)):
            agent_loop_manager.load_state(resume)
        return super().fit(agent_loop_manager)

    def _save_checkpoint(self) -> Any:
        """The manager's state first, then verl's checkpoint: verl writes
        ``latest_checkpointed_iteration.txt`` and calls ``checkpoint_callback.on_save`` last, so a
        checkpoint that verl calls latest always holds the predictor, and upload callbacks see it.
        With ``trainer.default_hdfs_dir`` the file is copied there too (verl's ``hdfs_io.copy``,
        beside the actor's remote copy)."""
        if callable(getattr(self.agent_loop_manager, "save_state", None)):
            saved = self.agent_loop_manager.save_state(step_folder(self.config.trainer, self.global_steps))
            remote = self.config.trainer.get("default_hdfs_dir", None)
            if saved is not None and remote:
                from verl.utils import hdfs_io

                target = os.path.join(str(remote), f"global_step_{self.global_steps}")
                hdfs_io.makedirs(target, exist_ok=True)
                if not hdfs_io.copy(str(saved), os.path.join(target, os.path.basename(str(saved)))):
                    raise OSError(f"could not copy {saved} to {target} (trainer.default_hdfs_dir)")
        return super()._save_checkpoint()

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        if self.config.algorithm.adv_estimator not in ESTIMATOR_NAMES:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(TREE_FIELDS))
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        metrics["tracerl/padding_rows"] = sum(padding)
        metrics["tracerl/trained_leaves"] = len(padding) - sum(padding)
        manager = getattr(self, "agent_loop_manager", None)
        metrics.update({f"tracerl/{k}": v for k, v in (getattr(manager, "last_metrics", None) or {}).items()})
        fields = neutral_padding({name: _column(data[name]) for name in TREE_FIELDS}, padding, list(batch.keys))
        with tree_fields(fields):
            out = super()._compute_advantage(batch, metrics)
        if self.config.get("tracerl", {}).get("check_advantages", False) and manager is not None:
            gap, largest = advantage_gap(batch, padding, manager.last_trees, self.config)
            metrics["tracerl/advantage_max_abs_diff"], metrics["tracerl/advantage_max_abs"] = gap, largest
        return out
