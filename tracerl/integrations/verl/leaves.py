"""Tree leaves as verl 0.9.1 TransferQueue samples, each with its own reward.

verl's own agent loop stores one sample per agent-loop output under the key
``{uid}_{session}_{index}`` (the replay buffer reads the prompt's ``uid`` back as the text before
the first ``_``) with unpadded per-sample tensors and tags; a list of outputs from one session is
one trajectory cut into segments, and verl copies the last output's reward onto the others.
Tree leaves do not go that way: each leaf is its own sample, key ``{uid}_{tree}_{leaf}``, with

* verl's fields: ``prompts``, ``responses``, ``response_mask`` (= ``loss_mask``: 1 on sampled
  tokens), ``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs`` (the
  sampling-time log-probs, 0 on observations), ``rm_scores`` (the leaf's verifier reward on its
  last sampled token), ``num_turns``, ``extra_fields``, and the prompt row's own fields;
* tracerl's tree fields (:data:`~tracerl.integrations.verl.rows.TREE_FIELDS`), which the
  ``tracerl_sync`` trainer hands to the estimator;
* tags as verl's: ``status``, lengths, ``global_steps`` and ``min/max_global_steps`` (the weights
  step the leaf was sampled under).

A leaf of a failed tree (a request of it failed: :class:`~.server_policy.VerlServerPolicy`) is
written as verl writes a padding row: its tokens, an all-zero ``response_mask``, reward 0, and
tree fields that make it a tree of its own (id ``failed:{tree}:{leaf}``, no turns, ``infra_failed``),
so its advantage is 0, it joins no group statistic and no token of it is trained.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from tracerl.core.types import RolloutTree, Trajectory
from tracerl.integrations.verl.rows import TREE_FIELDS, rows_from_trees

OWN_FIELDS = ("prompts", "responses", "response_mask", "loss_mask", "input_ids", "attention_mask", "position_ids",
              "rollout_log_probs", "rm_scores", "uid", "num_turns", "extra_fields") + TREE_FIELDS
"""The fields a leaf sets itself (a prompt row's field of the same name is not copied)."""


FAILED = "failed:"
"""Tree id prefix of a failed tree's leaf in TransferQueue (module docstring)."""


def mark_failed(trees: Sequence[RolloutTree], failed: Collection[str]) -> list[RolloutTree]:
    """Every leaf of a tree in ``failed`` (tree ids) set ``infra_failed`` with reward 0; the other trees."""
    for tree in trees:
        if tree.tree_id in failed:
            for traj in tree.trajectories.values():
                traj.infra_failed, traj.reward = True, 0.0
    return [tree for tree in trees if tree.tree_id not in failed]


def _failed_leaf(field: dict[str, Any], tree_id: str, leaf: int) -> None:
    for name in ("response_mask", "loss_mask", "rm_scores"):
        field[name] = torch.zeros_like(field[name])
    field.update({"tracerl_tree_id": f"{FAILED}{tree_id}:{leaf}", "tracerl_node_path": [0], "tracerl_turn_spans": [],
                  "tracerl_readiness": None, "tracerl_reward": 0.0, "tracerl_infra_failed": True})


def sequence_fields(prompt_ids: Sequence[int], response_ids: Sequence[int], mask: Sequence[int]) -> dict[str, Any]:
    """verl's per-sample sequence tensors of one row: ``prompts``, ``responses``, ``response_mask``
    and ``loss_mask`` (``mask``), ``input_ids``, ``attention_mask`` and ``position_ids``."""
    prompts = torch.tensor(list(prompt_ids), dtype=torch.int64)
    responses = torch.tensor(list(response_ids), dtype=torch.int64)
    response_mask = torch.tensor(list(mask), dtype=torch.int64)
    input_ids = torch.cat([prompts, responses])
    return {"prompts": prompts, "responses": responses, "response_mask": response_mask,
            "loss_mask": response_mask.clone(), "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "position_ids": torch.arange(input_ids.numel(), dtype=torch.int64)}


def num_turns(traj: Trajectory) -> int:
    """verl's count of chat turns: the prompt, each assistant turn and each tool observation."""
    return 1 + sum(1 + bool(t.observation_ids) for t in traj.turns)


def leaf_samples(
    trees: Sequence[RolloutTree], uid_of_task: Mapping[str, str], rows: Mapping[str, Mapping[str, Any]],
    global_steps: int, version: int, *, session_per_leaf: bool = False, failed: Collection[str] = (),
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Keys, fields and tags of every leaf of ``trees`` (module docstring).

    ``session_per_leaf``: key each leaf ``{uid}_{j}_0`` (``j`` counting the uid's leaves), one
    session per leaf. verl's validation keeps only the highest index of each ``{uid}_{session}``
    (as the final output of a multi-output session: ``_validate`` in
    ``verl/trainer/ppo/v1/trainer_base.py``), so validation chains need sessions of their own or
    all but one chain per prompt would go unscored.

    Args:
        trees: the step's trees (one per task in TRACE).
        uid_of_task: verl's prompt ``uid`` of each task id (the trees' ``task_id``).
        rows: each uid's prompt row (its other fields ride along, as verl's agent loop does).
        global_steps: the trainer step of the batch; ``version`` the weights step sampled under.
        failed: ids of the trees whose leaves are written as failed (module docstring).
    """
    order = {tree.tree_id: j for j, tree in enumerate(trees)}
    table = rows_from_trees(trees)
    keys, fields, tags = [], [], []
    seen: dict[str, int] = {}
    per_uid: dict[str, int] = {}
    for i, traj in enumerate(table.trajectories):
        uid = uid_of_task[traj.task_id]
        if "_" in uid:
            raise ValueError(f"uid {uid!r}: verl's replay buffer reads the uid before the first '_' of a key")
        leaf = seen.setdefault(traj.tree_id, 0)
        seen[traj.tree_id] = leaf + 1
        p = len(traj.prompt_ids)
        sequence = sequence_fields(traj.prompt_ids, traj.token_ids[p:], [int(s) for s in traj.sampled[p:]])
        responses, input_ids = sequence["responses"], sequence["input_ids"]
        field: dict[str, Any] = {k: v for k, v in rows.get(uid, {}).items() if k not in OWN_FIELDS}
        field.update(sequence)
        field.update({
            "rollout_log_probs": torch.tensor(traj.old_logprobs[p:], dtype=torch.float32),
            "rm_scores": table.token_level_rewards[i, : responses.numel()].clone(),
            "uid": uid, "num_turns": num_turns(traj),
            "extra_fields": {"min_global_steps": version, "max_global_steps": version, "reward_extra_info": {}},
        })
        field.update({name: table.non_tensor[name][i] for name in TREE_FIELDS})
        if traj.tree_id in failed:
            _failed_leaf(field, traj.tree_id, leaf)
        if session_per_leaf:
            j = per_uid.setdefault(uid, 0)
            per_uid[uid] = j + 1
            keys.append(f"{uid}_{j}_0")
        else:
            keys.append(f"{uid}_{order[traj.tree_id]}_{leaf}")
        fields.append(field)
        tags.append({"status": "success", "prompt_len": p, "response_len": responses.numel(),
                     "seq_len": input_ids.numel(), "global_steps": global_steps,
                     "min_global_steps": version, "max_global_steps": version})
    return keys, fields, tags
