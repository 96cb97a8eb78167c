"""Tree-aware and TRACE-credit advantage estimators (registered into ``ESTIMATORS``).

* ``tree_anchor``: the TRACE spec's tree-aware advantage (section 3), also the outcome part of
  ``trace_credit``: a leaf's group GRPO advantage plus, on each turn after a branching anchor,
  its GRPO advantage among the leaves under the nearest such anchor.
* ``tree_grpo``: Tree-GRPO's inter-tree plus intra-tree GRPO advantage (Ji et al., arXiv
  2509.21240).
* ``trace_credit``: ``w_out`` x ``tree_anchor``'s outcome advantage plus ``w_turn`` x TRACE turn
  credit (spec section 2 step 7).

Built on :mod:`tracerl.core.advantage_base`; imported by :mod:`tracerl.core.advantages`, so
importing that registers these too: import estimators from there.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from tracerl.core.advantage_base import (
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
from tracerl.core.credit import (
    centre_turn_terms,
    clip_turn_terms,
    fill_coefficients,
    prefix_values,
    td_turn_credit,
)
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
    return [_spread(t, v) for t, v in zip(batch.trajectories, per_turn, strict=True)]


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


@dataclass
class CreditParts:
    """The two terms of ``trace_credit`` per trajectory, per turn (``[n_turns]`` float64 each).

    ``outcome``: ``w_out`` x the tree-aware outcome advantage (less the fill's share with
    ``credit_fill = once``); ``turn``: ``w_turn c_k`` on transitions, shaped (centred, clipped);
    ``raw_turn``: the paper's unshaped ``w_turn c_k``; ``mixed``: whether the trajectory's group
    holds a success and a failure (its outcome advantage can be nonzero).
    """

    outcome: list[Tensor]
    turn: list[Tensor]
    raw_turn: list[Tensor]
    mixed: list[bool]


def _group_mixed(batch: AdvantageBatch, group_adv: Tensor) -> list[bool]:
    """Per trajectory: its group's outcome advantage is nonzero somewhere (rewards differ by at
    least the std ``eps``), i.e. the group is not all-same; infra-failed rows are never mixed."""
    signal: dict[str, bool] = {}
    for t, a in zip(batch.trajectories, group_adv.tolist(), strict=True):
        signal[t.group_id] = signal.get(t.group_id, False) or (not t.infra_failed and a != 0.0)
    return [signal[t.group_id] and not t.infra_failed for t in batch.trajectories]


def trace_credit_parts(batch: AdvantageBatch, options: AdvantageOptions) -> CreditParts:
    """Both terms of ``trace_credit`` (see :class:`CreditParts`), shaped by the credit options."""
    per_turn, group_adv = tree_outcome_turn_advantages(batch, options)
    outcome, raw, transitions = [], [], []
    for i, traj in enumerate(batch.trajectories):
        n = len(traj.turns)
        term, fill = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
        transition = torch.tensor([t.is_transition for t in traj.turns], dtype=torch.bool)
        if not traj.infra_failed:
            credit = trajectory_turn_credit(traj, float(group_adv[i]), options)
            term[transition] = options.w_turn * credit.to(torch.float64)
            coef = fill_coefficients(traj.num_transitions, options.horizon, options.gamma_td, options.terminal_scale)
            fill[transition] = options.w_turn * coef * float(group_adv[i])
        values = options.w_out * per_turn[i]
        outcome.append(values - fill if options.credit_fill == "once" else values)
        raw.append(term)
        transitions.append(transition)
    mixed = _group_mixed(batch, group_adv)
    dense = [r[m] for r, m in zip(raw, transitions, strict=True)]  # centring runs over transitions only
    groups = [t.group_id for t in batch.trajectories]
    shaped = clip_turn_terms(centre_turn_terms(dense, groups, mixed, options.credit_centre), options.credit_clip)
    turn = []
    for r, m, d in zip(raw, transitions, shaped, strict=True):
        full = torch.zeros_like(r)
        full[m] = d
        turn.append(full)
    return CreditParts(outcome, turn, raw, mixed)


@register_estimator("trace_credit", needs_readiness=True)
def trace_credit(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """``w_out`` x tree-aware outcome advantage + ``w_turn`` x ``c_k`` on transition k's
    assistant span (spec section 2 step 7, section 3 "with credit on"). ``A_out`` in the
    terminal fill is the leaf's group GRPO advantage; the answer turn gets no turn term.
    Infra-failed trajectories need no readiness (they get zeros). The options
    ``credit_centre``, ``credit_clip`` and ``credit_fill`` shape the turn term
    (:func:`trace_credit_parts`); their defaults are the paper's form."""
    parts = trace_credit_parts(batch, options)
    return [_spread(t, o + u) for t, o, u in zip(batch.trajectories, parts.outcome, parts.turn, strict=True)]


def credit_diagnostics(batch: AdvantageBatch, options: AdvantageOptions) -> dict[str, float]:
    """Cheap per-step readings of the turn term (no model, arithmetic on the readiness already scored).

    * ``credit_allsame_turn_mean`` / ``credit_allsame_turn_pos``: the paper's (unshaped) turn
      term ``w_turn c_k`` over the transitions of all-same groups, its mean and share > 0 (there
      it is the only gradient; NaN when the batch has no such transition);
    * ``credit_turn_outcome_cos``: cosine between the per-token turn-term and outcome-term
      vectors as trained (shaped), over the sampled tokens of the batch. A direction of the
      advantages, not of the gradients: ``sum_t A_t grad log p_t`` weighs each token's score by
      its advantage, so aligned advantage vectors push the same tokens the same way; NaN when
      either vector is 0;
    * ``credit_mixed_flip_share``: over the transitions of mixed groups whose outcome term is not 0,
      the share where the turn term (as trained) flips the sign of the outcome term: where turn
      credit overrides the outcome (NaN when the batch has no such transition).
    """
    parts = trace_credit_parts(batch, options)
    same = [v for r, m, t in zip(parts.raw_turn, parts.mixed, batch.trajectories, strict=True) if not m and not t.infra_failed
            for v, turn in zip(r.tolist(), t.turns, strict=True) if turn.is_transition]
    trajs = batch.trajectories
    turn = torch.cat([_spread(t, u) for t, u in zip(trajs, parts.turn, strict=True)] or [torch.zeros(0)]).double()
    out = torch.cat([_spread(t, o) for t, o in zip(trajs, parts.outcome, strict=True)] or [torch.zeros(0)]).double()
    norm = float(turn.norm() * out.norm())
    nan = float("nan")
    flips = [bool((o + u) * o < 0) for r_o, r_u, t, m in zip(parts.outcome, parts.turn, trajs, parts.mixed, strict=True)
             if m for o, u, turn_ in zip(r_o.tolist(), r_u.tolist(), t.turns, strict=True)
             if turn_.is_transition and o != 0.0]
    return {
        "credit_allsame_turn_mean": sum(same) / len(same) if same else nan,
        "credit_allsame_turn_pos": sum(v > 0 for v in same) / len(same) if same else nan,
        "credit_turn_outcome_cos": float(turn @ out) / norm if norm > 0 else nan,
        "credit_mixed_flip_share": sum(flips) / len(flips) if flips else nan,
    }
