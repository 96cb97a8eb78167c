"""What a batch of rollout trees says about its prompts: outcome groups and the effective ratio.

A prompt's group is the rewards of its finished, non-infra-failed leaves over all its trees; a
group is *mixed* when it holds a success and a failure (spec section 1), and the effective ratio
is the share of mixed groups. Every rollout scheme reports these (``SchemeResult``), and the
effective ratio is what TRACE allocation raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracerl.core.types import RolloutTree


def _valid_rewards(tree: RolloutTree) -> list[float]:
    return [t.reward for t in tree.trajectories.values() if not t.infra_failed]


def group_outcomes(trees: Sequence[RolloutTree]) -> dict[str, list[float]]:
    """Rewards of the finished, non-infra-failed leaves of each prompt (task id), all trees pooled."""
    groups: dict[str, list[float]] = {}
    for tree in trees:
        groups.setdefault(tree.task_id, []).extend(_valid_rewards(tree))
    return groups


def is_mixed(rewards: Sequence[float]) -> bool:
    """At least one success (r > 0.5) and one failure (r <= 0.5), spec section 1."""
    return any(r > 0.5 for r in rewards) and any(r <= 0.5 for r in rewards)


def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of the prompts in ``trees`` whose group is mixed (0.0 for an empty batch)."""
    groups = group_outcomes(trees)
    return sum(is_mixed(g) for g in groups.values()) / len(groups) if groups else 0.0


def _summary(trees: Sequence[RolloutTree]) -> dict[str, float]:
    groups = group_outcomes(trees)
    mixed = [g for g in groups.values() if is_mixed(g)]
    leaves = sum(len(g) for g in groups.values())
    return {
        "prompts": float(len(groups)),
        "mixed_prompts": float(len(mixed)),
        "leaves": float(leaves),
        "informative_leaves": float(sum(len(g) for g in mixed)),
        "success_rate": sum(r > 0.5 for g in groups.values() for r in g) / leaves if leaves else 0.0,
    }
