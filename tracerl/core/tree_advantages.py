"""Tree-aware and TRACE-credit advantage estimators (registered into ``ESTIMATORS``).

* ``tree_anchor``: the TRACE spec's tree-aware advantage (section 3), also the outcome part of
  ``trace_credit``: a leaf's group GRPO advantage plus, on each turn after a branching anchor,
  its GRPO advantage among the leaves under the nearest such anchor.
* ``tree_grpo``: Tree-GRPO's inter-tree plus intra-tree GRPO advantage (Ji et al., arXiv
  2509.21240).
* ``trace_credit``: ``w_out`` x ``tree_anchor``'s outcome advantage plus ``w_turn`` x TRACE turn
  credit (spec section 2 step 7).

Imported by :mod:`tracerl.core.advantages` at its end; import estimators from there.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import Tensor

from tracerl.core.advantages import (
    AdvantageBatch,
    AdvantageOptions,
    _broadcast,
    _outcome,
    _rewards_valid,
    _spread,
    _tree_path,
    group_outcome_advantage,
    register_estimator,
)
from tracerl.core.credit import prefix_values, td_turn_credit
from tracerl.core.types import Trajectory


def tree_outcome_turn_advantages(
    batch: AdvantageBatch, options: AdvantageOptions
) -> tuple[list[Tensor], Tensor]:
    """Tree-aware outcome advantage per turn (spec section 3) and the group advantage.

    Turn j of a leaf (node ``node_path[j+1]``) gets the leaf's group GRPO advantage plus
    its GRPO advantage among the valid batch leaves under the deepest branching anchor in
    ``node_path[1..j]`` (non-root nodes with more than one child); no anchor, no extra term.

    Returns:
        (per-trajectory ``[n_turns]`` float64 tensors, ``[B]`` float64 group advantage)
    """
    rewards, valid, groups = _rewards_valid(batch)
    group_adv = _outcome(rewards, groups, valid, options)
    row_keys: list[tuple[str, int]] = []
    row_traj: list[int] = []
    turn_rows: list[list[int]] = []  # per trajectory, per turn: row of the deepest anchor or -1
    anchor_cache: dict[str, set[int]] = {}
    for i, traj in enumerate(batch.trajectories):
        found = _tree_path(batch, traj, anchor_cache)
        rows = [-1] * len(traj.turns)
        if found is not None:
            path, anchors = found
            current = -1
            for j in range(len(traj.turns)):
                if j >= 1 and path[j] in anchors:
                    current = len(row_keys)
                    row_keys.append((traj.tree_id, path[j]))
                    row_traj.append(i)
                rows[j] = current
        turn_rows.append(rows)
    picks = torch.tensor(row_traj, dtype=torch.long)
    local = group_outcome_advantage(
        rewards[picks], row_keys, std=options.std, eps=options.eps, valid=valid[picks]
    )
    local = torch.cat([local, local.new_zeros(1)])  # row -1 reads this trailing zero
    per_turn = [
        group_adv[i] + local[torch.tensor(rows, dtype=torch.long)]
        for i, rows in enumerate(turn_rows)
    ]
    return per_turn, group_adv


@register_estimator("tree_anchor")
def tree_anchor(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """The TRACE spec's tree-aware advantage (section 3): group advantage plus the GRPO contrast
    under the nearest branching anchor above each turn; equals ``grpo`` on chains."""
    per_turn, _ = tree_outcome_turn_advantages(batch, options)
    return [_spread(t, v) for t, v in zip(batch.trajectories, per_turn)]


def search_tree_keys(batch: AdvantageBatch) -> list[Hashable]:
    """Tree-GRPO's tree of each trajectory, as a hashable key.

    Tree-GRPO grows ``M`` trees per prompt, each from one initial chain. Here a prompt's
    :class:`RolloutTree` holds all of them under one root: the subtree of a root child is one
    Tree-GRPO tree (expansions branch below the root, a root continuation starts a new tree). The
    key is ``(tree_id, node_path[1])``; a chain, a trajectory whose tree is not in the batch and
    a zero-turn leaf are each a tree of their own.
    """
    keys: list[Hashable] = []
    anchor_cache: dict[str, set[int]] = {}
    for i, traj in enumerate(batch.trajectories):
        found = _tree_path(batch, traj, anchor_cache)  # validates node_path against the tree
        if found is None or len(found[0]) < 2:
            keys.append(("own", i))
        else:
            keys.append((traj.tree_id, found[0][1]))
    return keys


@register_estimator("tree_grpo")
def tree_grpo(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """Tree-GRPO's advantage (Ji et al., arXiv 2509.21240; the authors' ``adv_estimator=tree``).

    ``A(leaf) = A_inter + A_intra``, unweighted: ``A_inter`` is the GRPO advantage among all
    valid leaves of the prompt (its group, all trees), ``A_intra`` the GRPO advantage among the
    valid leaves of its own tree (:func:`search_tree_keys`). The sum goes on every sampled token
    of the leaf, shared prefix included (each leaf trains as its full sequence). Both terms use
    ``options.std`` and ``options.eps`` like every estimator here: population std, and a group
    whose std is below ``eps`` (a single leaf included) gets 0. The authors' code divides by the
    unbiased std plus 1e-6 (``std = 'unbiased'`` comes close) and gives a one-leaf group
    ``r / 1`` instead of 0. A batch of one-leaf trees (chains) reduces to ``grpo``.
    """
    rewards, valid, groups = _rewards_valid(batch)
    inter = _outcome(rewards, groups, valid, options)
    intra = _outcome(rewards, search_tree_keys(batch), valid, options)
    return _broadcast(batch, inter + intra)


def trajectory_turn_credit(
    traj: Trajectory, outcome_advantage: float, options: AdvantageOptions
) -> Tensor:
    """TRACE credit ``c_k`` of each transition of one trajectory (spec section 2 steps 2-5),
    with the state values in the form ``options.credit_value``."""
    needed = traj.num_transitions + 1
    if traj.readiness is None or len(traj.readiness) != needed:
        got = "none" if traj.readiness is None else f"{len(traj.readiness)} scores"
        raise ValueError(
            f"trajectory {traj.task_id!r} (group {traj.group_id!r}) needs readiness for "
            f"{needed} prefixes S_0..S_T, got {got}"
        )
    try:
        scores = torch.tensor(traj.readiness, dtype=torch.float64)
        values = prefix_values(scores, options.credit_value, options.credit_eps)
        return td_turn_credit(
            values,
            outcome_advantage,
            horizon=options.horizon,
            gamma=options.gamma_td,
            terminal_scale=options.terminal_scale,
        )
    except ValueError as err:
        raise ValueError(f"trajectory {traj.task_id!r} (group {traj.group_id!r}): {err}") from err


@register_estimator("trace_credit", needs_readiness=True)
def trace_credit(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """``w_out`` x tree-aware outcome advantage + ``w_turn`` x ``c_k`` on transition k's
    assistant span (spec section 2 step 7, section 3 "with credit on"). ``A_out`` in the
    terminal fill is the leaf's group GRPO advantage; the answer turn gets no turn term.
    Infra-failed trajectories need no readiness (they get zeros)."""
    per_turn, group_adv = tree_outcome_turn_advantages(batch, options)
    out = []
    for i, traj in enumerate(batch.trajectories):
        values = options.w_out * per_turn[i]
        if not traj.infra_failed:
            credit = trajectory_turn_credit(traj, float(group_adv[i]), options)
            transition = torch.tensor([t.is_transition for t in traj.turns], dtype=torch.bool)
            turn_term = torch.zeros(len(traj.turns), dtype=torch.float64)
            turn_term[transition] = credit.to(torch.float64)
            values = values + options.w_turn * turn_term
        out.append(_spread(traj, values))
    return out
