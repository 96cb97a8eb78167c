"""``tracerl_sync``: verl 0.9.1's sync trainer whose advantage step hands the tree fields to
tracerl's estimators.

verl's v1 advantage step reads a fixed list of fields from TransferQueue and calls the estimator
with four arguments, so this trainer reads the tree fields (:data:`~.rows.TREE_FIELDS`) for the
same keys and opens :func:`~.estimators.tree_fields` around verl's own step; everything else is
verl's. verl reads the registered name as its trainer mode and tests it against ``"sync"`` in
several places, so the trainer sets its mode back to ``sync`` before the replay buffer is built.

With ``+tracerl.readiness=reference_worker`` it has verl build its reference worker without a KL
that weighs anything and without a reference forward over every leaf (:func:`reference_for_readiness`);
with ``+tracerl.readiness=reference_server`` it starts frozen-reference servers on GPUs of their own
and hands their client to the manager as verl's ``teacher_client`` (:mod:`.readiness_servers`).

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

from tracerl.errors import UserError
from tracerl.integrations.verl.estimators import tree_fields
from tracerl.integrations.verl.leaves import FAILED, sequence_fields
from tracerl.integrations.verl.names import ESTIMATOR_NAMES, TRAINER_NAME
from tracerl.integrations.verl.reference import VerlReference
from tracerl.integrations.verl.registrations import require_registrations
from tracerl.integrations.verl.rows import TREE_FIELDS, neutral_padding, object_array


REFERENCE_PARTITION = "tracerl_reference"
"""TransferQueue partition of the readiness rows scored on verl's reference worker."""


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
    ``|advantage|`` of a real leaf (``+tracerl.check=true``; one TransferQueue read a step)."""
    import torch

    from tracerl.core.advantages import AdvantageBatch, get_estimator
    from tracerl.integrations.verl.estimators import options_from

    got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                          select_fields=["advantages", "response_mask", "tracerl_tree_id", "tracerl_node_path"])
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in trees for t in tree.trajectories.values()}
    # a failed tree's leaf weighs nothing, as a padding row (leaves.FAILED)
    padding = [pad or str(got["tracerl_tree_id"][i]).startswith(FAILED) for i, pad in enumerate(padding)]
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


def reference_for_readiness(config: Any) -> bool:
    """With ``+tracerl.readiness=reference_worker`` and no KL term, make verl build its reference
    worker: ``actor.use_kl_loss=True`` with ``kl_loss_coef=0`` (verl builds one only for a KL), the
    loss unchanged, and :meth:`TraceSyncTrainer._compute_ref_log_prob` skips the forward that KL
    would ask for. Whether it changed ``config``."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_reference_policy

    section = config.get("tracerl", None) or {}
    if str(section.get("readiness", "in_process")) != "reference_worker":
        return False
    ref = config.actor_rollout_ref.get("ref", {}) or {}
    if ref.get("log_prob_micro_batch_size_per_gpu", None) is None and not ref.get("log_prob_use_dynamic_bsz", False):
        raise UserError("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = null: +tracerl.readiness="
                        "reference_worker scores on verl's reference worker, which needs it (e.g. 4) or "
                        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True")
    if need_reference_policy(config):
        return False
    with open_dict(config):
        config.actor_rollout_ref.actor.use_kl_loss = True
        config.actor_rollout_ref.actor.kl_loss_coef = 0.0
    return True


@register_trainer(TRAINER_NAME)
class TraceSyncTrainer(PPOTrainerSync):
    """verl's sync trainer; ``algorithm.adv_estimator=tracerl_trace_credit`` (or
    ``tracerl_tree_anchor``) reads the tree fields each leaf carries in TransferQueue."""

    def __init__(self, config: Any) -> None:
        require_registrations()
        reference_for_readiness(config)
        super().__init__(config)

    def _setup(self) -> None:
        """verl's setup; with ``+tracerl.readiness=reference_server`` also the frozen-reference
        servers on GPUs of their own (:mod:`.readiness_servers`)."""
        from tracerl.integrations.verl.readiness_servers import ReferenceServers, wants_servers

        super()._setup()
        self._tracerl_servers = ReferenceServers(self.config) if wants_servers(self.config) else None

    def get_teacher_client(self) -> Any:
        """verl hands this to the agent loop manager as ``teacher_client``: the frozen-reference
        servers' client under ``SERVER_KEY`` when this trainer started them, else verl's own."""
        servers = getattr(self, "_tracerl_servers", None)
        return servers.client() if servers is not None else super().get_teacher_client()

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = "sync"  # verl compares the mode with "sync"; this trainer is sync
        return super()._build_replay_buffer()

    def _load_checkpoint(self) -> Any:
        out = super()._load_checkpoint()
        self._tracerl_resume = step_folder(self.config.trainer, self.global_steps, resuming=True) if self.global_steps > 0 else None
        return out

    def fit(self, agent_loop_manager: Any) -> Any:
        reference = getattr(agent_loop_manager, "verl_reference", None)
        if isinstance(reference, VerlReference):  # +tracerl.readiness=reference_worker: through verl's reference
            if not (self.use_reference_policy or self.ref_in_actor):
                raise UserError("+tracerl.readiness=reference_worker scores on verl's reference worker, which this "
                                "run does not build: set actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0 "
                                "leaves the loss as it is) or +tracerl.readiness=in_process")
            reference.compute = self.reference_logprobs
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

    def _compute_ref_log_prob(self, batch: Any, metrics: dict) -> Any:
        """verl's reference forward over every sample, unless its KL weighs nothing (``use_kl_loss``
        with ``kl_loss_coef = 0``, as :func:`reference_for_readiness` sets): then ``ref_log_prob`` is
        a copy of ``old_log_probs`` (the KL term is 0 times a number either way) and no forward runs."""
        actor = self.config.actor_rollout_ref.actor
        if float(actor.get("kl_loss_coef", 0.0)) != 0.0 or self.config.algorithm.get("use_kl_in_reward", False):
            return super()._compute_ref_log_prob(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["old_log_probs"])
        data["ref_log_prob"] = data.pop("old_log_probs")
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data.select("ref_log_prob"))
        return batch

    def reference_logprobs(self, rows: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[Any]:
        """verl's frozen-reference log-probs (temperature 1) of each ``(prompt_ids, response_ids)``
        row's response tokens: the rows go into a TransferQueue partition of their own, padded to
        the reference's data-parallel size, through the same worker call as verl's
        ``_compute_ref_log_prob`` (the actor with its adapter off when the reference lives there)."""
        from transfer_queue.metadata import KVBatchMeta
        from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict
        from verl.workers.utils.padding import response_from_nested

        self._tracerl_ref_calls = getattr(self, "_tracerl_ref_calls", 0) + 1
        keys = [f"tracerlref{self._tracerl_ref_calls}x{i}_0_0" for i in range(len(rows))]
        fields = [sequence_fields(prompt, response, [1] * len(response)) for prompt, response in rows]
        tags = [{"status": "success", "prompt_len": len(prompt), "response_len": len(response),
                 "seq_len": len(prompt) + len(response)} for prompt, response in rows]
        tq.kv_batch_put(keys=keys, partition_id=REFERENCE_PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)
        group = self.actor_rollout_wg if self.ref_in_actor else self.ref_policy_wg
        role = "actor" if self.ref_in_actor else "ref"
        if role not in group._dispatch_info:
            group._dispatch_info[role] = group._query_dispatch_info(role)
        section = self.config.actor_rollout_ref.rollout if self.ref_in_actor else self.config.actor_rollout_ref.ref
        micro = 1 if section.get("log_prob_use_dynamic_bsz", False) else int(section.get("log_prob_micro_batch_size_per_gpu") or 1)
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id=REFERENCE_PARTITION)
        # each data-parallel rank gets whole micro-batches (verl's prepare_micro_batches asserts it)
        multiple = (max(group._dispatch_info[role]) + 1) * micro
        batch = upsample_batch_to_divisible_size(batch, multiple, self.tokenizer.eos_token_id)
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False, "temperature": 1.0,
                                 **({"no_lora_adapter": True} if self.ref_in_actor else {})})
        try:
            if self.ref_in_actor:
                self.actor_rollout_wg.compute_log_prob(batch)
            else:
                self.ref_policy_wg.compute_ref_log_prob(batch)
            data = tq.kv_batch_get(keys=batch.keys, partition_id=REFERENCE_PARTITION,
                                   select_fields=["log_probs", "response_mask"])
            logprobs = response_from_nested(data["log_probs"], data["response_mask"])
            return [logprobs[i] for i in range(len(rows))]
        finally:
            tq.kv_clear(keys=batch.keys, partition_id=REFERENCE_PARTITION)

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
        if self.config.get("tracerl", {}).get("check", False) and manager is not None:
            gap, largest = advantage_gap(batch, padding, manager.last_trees, self.config)
            metrics["tracerl/advantage_max_abs_diff"], metrics["tracerl/advantage_max_abs"] = gap, largest
        return out
