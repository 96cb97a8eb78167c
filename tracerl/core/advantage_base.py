"""What every advantage estimator builds on: the batch and options it takes, the registry it
joins, group statistics, and the spreading of per-turn values onto tokens.

Two modules of estimators share these: :mod:`tracerl.core.advantages` (``grpo``, ``rloo``,
``gigpo``) and :mod:`tracerl.core.tree_advantages` (tree-aware and TRACE-credit). The first imports
the second, so importing it registers every built-in estimator; import estimators and the names
here from :mod:`tracerl.core.advantages`, which re-exports them.

Group statistics are computed with ``index_add`` over integer group indices, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tracerl.core.credit import CENTRE_MODES, FILL_FORMS, VALUE_FORMS
from tracerl.core.registry import Registry
from tracerl.core.types import RolloutTree, Trajectory

STD_MODES = ("population", "unbiased", "none")


@dataclass
class AdvantageOptions:
    """Knobs of all estimators; each estimator reads the fields it needs."""

    std: str = "population"
    """Group std for normalisation: ``population`` (divide by G, spec default), ``unbiased``
    (divide by G-1; a single valid member gets 0) or ``none`` (``r - mean`` only)."""
    eps: float = 1e-6
    """A group whose std is below ``eps`` gets advantage 0 (spec section 2 step 6)."""
    omega: float = 1.0
    """GiGPO: weight of the step advantage."""
    step_gamma: float = 0.95
    """GiGPO: discount of step returns, ``R_t = step_gamma^(n_turns-1-t) * reward``."""
    horizon: int = 3
    """TRACE credit window ``K`` (0 disables the dense part)."""
    gamma_td: float = 0.8
    """TRACE credit window discount ``g``."""
    terminal_scale: float = 2.0
    """TRACE terminal fill scale ``kappa``."""
    credit_eps: float = 0.1
    """TRACE remaining-gap ``eps`` in ``d_k = -l_k + eps``."""
    credit_value: str = "log_ratio"
    """TRACE state-value form (the credit paper's ablation; ``V_0 = 0`` in each): ``log_ratio``
    ``V_k = log(d_0/d_k)`` (the paper's), ``raw_diff`` ``V_k = l_k - l_0`` or ``remaining_gap``
    ``V_k = (d_0 - d_k)/d_0``; see :func:`tracerl.core.credit.prefix_values`."""
    w_out: float = 1.0
    """TRACE weight of the outcome advantage."""
    w_turn: float = 0.2
    """TRACE weight of the turn credit."""
    credit_centre: str = "none"
    """TRACE turn term across a group: ``none`` (the paper's), ``gated`` (centred over the mixed
    group's transitions, absent in all-same groups) or ``gated_turn`` (centred per group and turn
    index); see :func:`tracerl.core.credit.centre_turn_terms`."""
    credit_clip: float = 0.0
    """TRACE clip ``|w_turn c_k| <= credit_clip`` after centring (0: no clip, the paper's)."""
    credit_fill: str = "add"
    """TRACE terminal fill: ``add`` (the paper's) or ``once`` (its ``A_out`` is taken out of the
    outcome term, so the outcome counts once on every token; see ``FILL_FORMS``)."""

    def __post_init__(self) -> None:
        if self.std not in STD_MODES:
            raise ValueError(f"std must be one of {', '.join(STD_MODES)}; got {self.std!r}")
        if self.credit_value not in VALUE_FORMS:
            raise ValueError(f"credit_value must be one of {', '.join(VALUE_FORMS)}; got {self.credit_value!r}")
        for name, allowed in (("credit_centre", CENTRE_MODES), ("credit_fill", FILL_FORMS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if not _is_number(self.credit_clip) or not math.isfinite(self.credit_clip) or self.credit_clip < 0:
            raise ValueError(f"credit_clip must be a finite number >= 0 (0: no clip), got {self.credit_clip!r}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < 0:
            raise ValueError(f"horizon must be an integer >= 0, got {self.horizon!r}")
        for name in ("eps", "credit_eps"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("step_gamma", "gamma_td"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
        for name in ("omega", "terminal_scale", "w_out", "w_turn"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class AdvantageBatch:
    """The trajectories of one training step and the rollout trees they are leaves of.

    ``trees`` maps ``tree_id`` to its tree; a trajectory whose tree is absent is a chain.
    """

    trajectories: list[Trajectory]
    trees: dict[str, RolloutTree] = field(default_factory=dict)


Estimator = Callable[[AdvantageBatch, AdvantageOptions], list[Tensor]]
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
"""Estimators by name; ``get`` also resolves ``package.module:function`` import paths."""


def register_estimator(name: str, *, needs_readiness: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering an estimator under ``name`` (duplicate names are an error).

    ``needs_readiness`` declares that the estimator reads ``Trajectory.readiness`` (the frozen
    reference's score of every prefix), so the trainer must score prefixes; it is stored on the
    function as ``needs_readiness`` and read by :func:`estimator_needs_readiness`.
    """

    def wrap(fn: Estimator) -> Estimator:
        ESTIMATORS.add(name, fn)
        fn.needs_readiness = needs_readiness  # type: ignore[attr-defined]
        return fn

    return wrap


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name`` (or at an import path); unknown names list the valid ones."""
    return ESTIMATORS.get(name)


def available_estimators() -> list[str]:
    return ESTIMATORS.names()


def estimator_needs_readiness(name: str) -> bool:
    """Whether the estimator ``name`` declared ``needs_readiness`` (plain functions: False)."""
    return bool(getattr(get_estimator(name), "needs_readiness", False))


# ----------------------------------------------------------------------------- group math


def _group_index(keys: Sequence[Hashable]) -> tuple[Tensor, int]:
    """Map hashable group keys to dense indices 0..G-1 in order of first appearance."""
    index: dict[Hashable, int] = {}
    ids = [index.setdefault(k, len(index)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), len(index)


def _check_rewards(rewards: Tensor, n_ids: int, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError("rewards must be a 1-D torch.Tensor")
    if rewards.numel() != n_ids:
        raise ValueError(f"rewards has {rewards.numel()} entries but group_ids has {n_ids}")
    if valid is None:
        valid = torch.ones(rewards.numel(), dtype=torch.bool)
    elif not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.shape != rewards.shape:
        raise ValueError(f"valid must be a bool tensor of shape {tuple(rewards.shape)}")
    r = rewards.detach().to(torch.float64)
    bad = valid & ~torch.isfinite(r)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise ValueError(f"non-finite rewards at valid rows {rows}")
    return torch.where(valid, r, torch.zeros((), dtype=torch.float64)), valid


def group_outcome_advantage(
    rewards: Tensor,
    group_ids: Sequence[Hashable],
    *,
    std: str = "population",
    eps: float = 1e-6,
    valid: Tensor | None = None,
) -> Tensor:
    """GRPO advantage ``(r - mean_g) / std_g`` within each group (spec section 2 step 6).

    Args:
        rewards: ``[B]`` terminal rewards.
        group_ids: ``B`` hashable group keys (a tensor is read with ``.tolist()``).
        std: ``population`` (divide by G), ``unbiased`` (G-1) or ``none`` (``r - mean``).
        eps: groups with std below ``eps`` get 0 (no signal, not a blown-up ratio).
        valid: ``[B]`` bool; invalid rows (infra failures) are left out and get 0.

    Returns:
        ``[B]`` advantages in the rewards' floating dtype (float32 for integer rewards).
    """
    if std not in STD_MODES:
        raise ValueError(f"std must be one of {', '.join(STD_MODES)}; got {std!r}")
    if not _is_number(eps) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    keys = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    r, valid = _check_rewards(rewards, len(keys), valid)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if r.numel() == 0:
        return torch.zeros(0, dtype=out_dtype)
    idx, n_groups = _group_index(keys)
    w = valid.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, w)
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, r)
    mean = total / count.clamp(min=1.0)
    centered = (r - mean[idx]) * w
    if std == "none":
        adv = centered
    else:
        sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, centered**2)
        dof = count if std == "population" else count - 1.0
        sd = torch.sqrt(sq / dof.clamp(min=1.0))
        usable = (dof > 0) & (sd >= eps)
        scale = torch.where(usable, sd, torch.ones_like(sd))
        adv = torch.where(usable[idx], centered / scale[idx], torch.zeros_like(centered))
    return torch.where(valid, adv, torch.zeros_like(adv)).to(out_dtype)


def leave_one_out_advantage(
    rewards: Tensor, group_ids: Sequence[Hashable], valid: Tensor | None = None
) -> Tensor:
    """RLOO: ``r_i`` minus the mean of the other valid members; 0 for singletons / invalid."""
    keys = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    r, valid = _check_rewards(rewards, len(keys), valid)
    if r.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    idx, n_groups = _group_index(keys)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, valid.to(torch.float64))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, r)
    others = count[idx] - 1.0
    use = valid & (others > 0)
    loo_mean = (total[idx] - r) / others.clamp(min=1.0)
    return torch.where(use, r - loo_mean, torch.zeros_like(r))


# ----------------------------------------------------------------------------- batch helpers


def _rewards_valid(batch: AdvantageBatch) -> tuple[Tensor, Tensor, list[str]]:
    trajs = batch.trajectories
    rewards = torch.tensor([float(t.reward) for t in trajs], dtype=torch.float64)
    valid = torch.tensor([not t.infra_failed for t in trajs], dtype=torch.bool)
    return rewards, valid, [t.group_id for t in trajs]


def _outcome(
    rewards: Tensor, groups: Sequence[Hashable], valid: Tensor, options: AdvantageOptions
) -> Tensor:
    return group_outcome_advantage(rewards, groups, std=options.std, eps=options.eps, valid=valid)


def _spread(traj: Trajectory, turn_values: Tensor) -> Tensor:
    """Per-turn values -> ``[len(token_ids)]`` float32: each turn's assistant span gets its
    value; prompt and observation tokens get 0, exactly aligned with ``traj.sampled``."""
    length = len(traj.prompt_ids) + sum(
        len(turn.assistant_ids) + len(turn.observation_ids) for turn in traj.turns
    )
    out = torch.zeros(length, dtype=torch.float32)
    if traj.infra_failed:
        return out
    # Slice fills, not repeat_interleave: the latter goes multi-threaded on tiny inputs
    # and stalls for milliseconds on a busy CPU.
    for (start, end), value in zip(traj.turn_spans, turn_values.tolist(), strict=True):
        out[start:end] = value
    return out


def _broadcast(batch: AdvantageBatch, per_traj: Tensor) -> list[Tensor]:
    return [_spread(t, per_traj[i].expand(len(t.turns))) for i, t in enumerate(batch.trajectories)]


def _tree_path(
    batch: AdvantageBatch, traj: Trajectory, anchor_cache: dict[str, set[int]]
) -> tuple[list[int], set[int]] | None:
    """The trajectory's checked node path and its tree's branch anchors, or None for chains."""
    tree = batch.trees.get(traj.tree_id) if traj.tree_id else None
    if tree is None:
        return None
    path = list(traj.node_path)
    if len(path) != len(traj.turns) + 1:
        raise ValueError(
            f"trajectory {traj.task_id!r} in tree {traj.tree_id!r}: node_path has {len(path)} "
            f"entries for {len(traj.turns)} turns (need turns + 1)"
        )
    leaf = path[-1]
    if not 0 <= leaf < len(tree.nodes) or not tree.nodes[leaf].is_leaf or tree.path(leaf) != path:
        raise ValueError(
            f"trajectory {traj.task_id!r}: node_path {path} is not a root-to-leaf path of "
            f"tree {traj.tree_id!r}"
        )
    if traj.tree_id not in anchor_cache:
        anchor_cache[traj.tree_id] = set(tree.branch_anchors())
    return path, anchor_cache[traj.tree_id]
