"""Slow, loop-by-loop reference implementations of the credit and advantage math.

Written straight from the spec's sentences (section 2 steps 6-7, section 3 tree-aware
advantage, GiGPO step groups) so the vectorised estimators can be compared against them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions
from tracerl.core.allocation import root_value
from tracerl.core.types import Trajectory


def slow_credit(
    values: list[float], a_out: float, horizon: int, gamma: float, kappa: float
) -> list[float]:
    """Spec section 2 steps 3-5 as a plain loop (reference for the vectorised version)."""
    t_count = len(values) - 1
    deltas = [values[k + 1] - values[k] for k in range(t_count)]
    out = []
    for k in range(t_count):
        if horizon == 0:
            h, c = 0, 0.0
        else:
            h = min(horizon - 1, t_count - 1 - k)
            num = sum(gamma**j * deltas[k + j] for j in range(h + 1))
            den = sum(gamma**j for j in range(h + 1))
            c = num / den
        if k + h == t_count - 1:
            c += kappa * gamma ** (t_count - k) * a_out
        out.append(c)
    return out


def slow_group_adv(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    valid: Sequence[bool],
    std: str = "population",
    eps: float = 1e-6,
) -> list[float]:
    out = [0.0] * len(rewards)
    for g in dict.fromkeys(groups):
        members = [i for i in range(len(rewards)) if groups[i] == g and valid[i]]
        if not members:
            continue
        mean = sum(rewards[i] for i in members) / len(members)
        if std == "none":
            for i in members:
                out[i] = rewards[i] - mean
            continue
        dof = len(members) if std == "population" else len(members) - 1
        if dof <= 0:
            continue
        sd = math.sqrt(sum((rewards[i] - mean) ** 2 for i in members) / dof)
        if sd < eps:
            continue
        for i in members:
            out[i] = (rewards[i] - mean) / sd
    return out


def slow_rloo(
    rewards: Sequence[float], groups: Sequence[Hashable], valid: Sequence[bool]
) -> list[float]:
    out = [0.0] * len(rewards)
    for i in range(len(rewards)):
        others = [
            rewards[j]
            for j in range(len(rewards))
            if j != i and valid[j] and groups[j] == groups[i]
        ]
        if valid[i] and others:
            out[i] = rewards[i] - sum(others) / len(others)
    return out


def slow_spread(traj: Trajectory, turn_values: Sequence[float]) -> list[float]:
    tokens = [0.0] * len(traj.prompt_ids)
    for turn, value in zip(traj.turns, turn_values, strict=True):
        tokens += [0.0 if traj.infra_failed else value] * len(turn.assistant_ids)
        tokens += [0.0] * len(turn.observation_ids)
    return tokens


def _columns(batch: AdvantageBatch) -> tuple[list[float], list[str], list[bool]]:
    trajs = batch.trajectories
    return (
        [t.reward for t in trajs],
        [t.group_id for t in trajs],
        [not t.infra_failed for t in trajs],
    )


def slow_grpo(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    rewards, groups, valid = _columns(batch)
    adv = slow_group_adv(rewards, groups, valid, opts.std, opts.eps)
    return [slow_spread(t, [adv[i]] * len(t.turns)) for i, t in enumerate(batch.trajectories)]


def slow_rloo_tokens(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    rewards, groups, valid = _columns(batch)
    adv = slow_rloo(rewards, groups, valid)
    return [slow_spread(t, [adv[i]] * len(t.turns)) for i, t in enumerate(batch.trajectories)]


def slow_gigpo(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    rewards, groups, valid = _columns(batch)
    episode = slow_group_adv(rewards, groups, valid, opts.std, opts.eps)
    keys, returns, step_valid, owner = [], [], [], []
    for i, traj in enumerate(batch.trajectories):
        n = len(traj.turns)
        for t in range(n):
            keys.append((traj.group_id, tuple(tuple(u.observation_ids) for u in traj.turns[:t])))
            returns.append(opts.step_gamma ** (n - 1 - t) * traj.reward)
            step_valid.append(valid[i])
            owner.append(i)
    step = slow_group_adv(returns, keys, step_valid, opts.std, opts.eps)
    out = []
    for i, traj in enumerate(batch.trajectories):
        mine = [step[s] for s in range(len(step)) if owner[s] == i]
        out.append(slow_spread(traj, [episode[i] + opts.omega * a for a in mine]))
    return out


def slow_tree_turn_values(
    batch: AdvantageBatch, opts: AdvantageOptions
) -> tuple[list[list[float]], list[float]]:
    rewards, groups, valid = _columns(batch)
    group_adv = slow_group_adv(rewards, groups, valid, opts.std, opts.eps)
    per_turn = []
    for i, traj in enumerate(batch.trajectories):
        tree = batch.trees.get(traj.tree_id)
        values = []
        for j in range(len(traj.turns)):
            extra = 0.0
            if tree is not None:
                anchors = [n for n in traj.node_path[1 : j + 1] if len(tree.nodes[n].children) > 1]
                if anchors:
                    a = anchors[-1]
                    under = [
                        k
                        for k, other in enumerate(batch.trajectories)
                        if other.tree_id == traj.tree_id and a in other.node_path
                    ]
                    local = slow_group_adv(
                        [rewards[k] for k in under],
                        [0] * len(under),
                        [valid[k] for k in under],
                        opts.std,
                        opts.eps,
                    )
                    extra = local[under.index(i)]
            values.append(group_adv[i] + extra)
        per_turn.append(values)
    return per_turn, group_adv


def slow_tree_anchor(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    per_turn, _ = slow_tree_turn_values(batch, opts)
    return [slow_spread(t, v) for t, v in zip(batch.trajectories, per_turn, strict=True)]


def slow_tree_grpo(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    """Tree-GRPO: GRPO over the prompt's leaves plus GRPO over the leaves of the same search
    tree (same RolloutTree and same first node below the root); chains are one-leaf trees."""
    rewards, groups, valid = _columns(batch)
    inter = slow_group_adv(rewards, groups, valid, opts.std, opts.eps)
    trees = []
    for i, traj in enumerate(batch.trajectories):
        registered = traj.tree_id in batch.trees and len(traj.node_path) > 1
        trees.append((traj.tree_id, traj.node_path[1]) if registered else ("own", i))
    intra = slow_group_adv(rewards, trees, valid, opts.std, opts.eps)
    return [
        slow_spread(t, [inter[i] + intra[i]] * len(t.turns)) for i, t in enumerate(batch.trajectories)
    ]


def slow_values(readiness: Sequence[float], form: str, eps: float) -> list[float]:
    """The three credit value forms written out (spec section 2 step 2 and its ablation)."""
    d = [-score + eps for score in readiness]
    if form == "log_ratio":
        return [math.log(d[0] / dk) for dk in d]
    if form == "raw_diff":
        return [lk - readiness[0] for lk in readiness]
    return [(d[0] - dk) / d[0] for dk in d]


def slow_trace_credit(batch: AdvantageBatch, opts: AdvantageOptions) -> list[list[float]]:
    per_turn, group_adv = slow_tree_turn_values(batch, opts)
    out = []
    for i, traj in enumerate(batch.trajectories):
        values = [opts.w_out * v for v in per_turn[i]]
        if not traj.infra_failed:
            assert traj.readiness is not None
            v = slow_values(traj.readiness, opts.credit_value, opts.credit_eps)
            credit = slow_credit(v, group_adv[i], opts.horizon, opts.gamma_td, opts.terminal_scale)
            k = 0
            for j, turn in enumerate(traj.turns):
                if turn.action.kind != "answer":
                    values[j] += opts.w_turn * credit[k]
                    k += 1
        out.append(slow_spread(traj, values))
    return out


SLOW = {
    "grpo": slow_grpo,
    "rloo": slow_rloo_tokens,
    "gigpo": slow_gigpo,
    "tree_anchor": slow_tree_anchor,
    "tree_grpo": slow_tree_grpo,
    "trace_credit": slow_trace_credit,
}


def brute_force_roots(
    probs: list[float], budget: int, lo: int, hi: int | None, floor: int = 0
) -> tuple[float, list[int]] | None:
    """Stage 1 by enumeration: the best value and the lexicographically largest optimal vector (ties
    within 1e-12), each prompt's count in ``{floor} | [max(lo, floor), hi]`` (``floor`` 0: the paper's
    form, where a prompt may get nothing)."""
    top = budget if hi is None else hi
    choices = sorted({floor, *range(max(lo, floor), top + 1)})
    feasible = [c for c in itertools.product(choices, repeat=len(probs)) if sum(c) == budget]
    if not feasible:
        return None
    value = {c: sum(root_value(p, m) for p, m in zip(probs, c, strict=True)) for c in feasible}
    best = max(value.values())
    return best, list(max(c for c in feasible if value[c] >= best - 1e-12))
