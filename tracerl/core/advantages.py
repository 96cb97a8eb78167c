"""Advantage estimators: one typed batch in, per-token advantages out, registered by name.

Every estimator has the signature ``(batch: AdvantageBatch, options: AdvantageOptions) ->
list[Tensor]`` and returns, per trajectory, a float32 tensor of shape ``[len(token_ids)]``
that is nonzero only where ``trajectory.sampled`` is True (observation and prompt tokens are
forced, never trained on) and all-zero for ``infra_failed`` trajectories, which are also left
out of every group statistic (spec section 2 step 6).

Estimators (spec sections 2-4):

* ``grpo``: group-normalised outcome advantage broadcast to all sampled tokens.
* ``rloo``: reward minus the mean of the other valid members of the group.
* ``gigpo``: episode advantage plus ``omega`` x step advantage over identical anchor states.
* ``tree_grpo``, ``tree_anchor``, ``trace_credit``: in :mod:`tracerl.core.tree_advantages` (tree-aware
  and TRACE-credit estimators; importing this module imports it, which registers them).

The batch, the options, the registry, the group statistics (``group_outcome_advantage``,
``leave_one_out_advantage``) and the spreading onto tokens live in
:mod:`tracerl.core.advantage_base`, which both estimator modules build on; they are re-exported here.
Estimators live in :data:`ESTIMATORS` (a :class:`~tracerl.core.registry.Registry`, so
``algo.estimator`` may also be a ``package.module:function`` path); one that reads readiness
declares it (``register_estimator(name, needs_readiness=True)``) and the config checks that.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tracerl.core import tree_advantages as _tree_advantages  # noqa: F401 - registers the tree-aware estimators
from tracerl.core.advantage_base import (  # noqa: F401 - the shared names re-exported (home: advantage_base.py)
    ESTIMATORS,
    STD_MODES,
    AdvantageBatch,
    AdvantageOptions,
    Estimator,
    _broadcast,
    _outcome,
    _rewards_valid,
    _spread,
    available_estimators,
    estimator_needs_readiness,
    get_estimator,
    group_outcome_advantage,
    leave_one_out_advantage,
    register_estimator,
)


# ----------------------------------------------------------------------------- estimators


@register_estimator("grpo")
def grpo(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """Group outcome advantage on every sampled token (spec section 4 ``grpo``)."""
    rewards, valid, groups = _rewards_valid(batch)
    return _broadcast(batch, _outcome(rewards, groups, valid, options))


@register_estimator("rloo")
def rloo(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """Leave-one-out baseline, unnormalised (``options.std`` is not used)."""
    rewards, valid, groups = _rewards_valid(batch)
    return _broadcast(batch, leave_one_out_advantage(rewards, groups, valid))


@register_estimator("gigpo")
def gigpo(batch: AdvantageBatch, options: AdvantageOptions) -> list[Tensor]:
    """GiGPO: episode advantage + ``omega`` x step advantage (spec section 4 ``gigpo``).

    The state before turn t is identified by the group and the observation ids of turns
    ``< t`` (the prompt is shared within a group). Step returns are terminal-only,
    ``R_t = step_gamma^(n_turns-1-t) * reward``, normalised among all steps of the batch
    with an identical state (same ``std`` option); singleton states get 0.
    """
    rewards, valid, groups = _rewards_valid(batch)
    episode = _outcome(rewards, groups, valid, options)
    states: dict[tuple[object, ...], int] = {}
    step_keys: list[int] = []
    step_returns: list[float] = []
    step_valid: list[bool] = []
    for i, traj in enumerate(batch.trajectories):
        state = states.setdefault(("root", traj.group_id), len(states))
        n = len(traj.turns)
        for t, turn in enumerate(traj.turns):
            step_keys.append(state)
            step_returns.append(options.step_gamma ** (n - 1 - t) * float(traj.reward))
            step_valid.append(bool(valid[i]))
            state = states.setdefault((state, tuple(turn.observation_ids)), len(states))
    step_adv = group_outcome_advantage(
        torch.tensor(step_returns, dtype=torch.float64),
        step_keys,
        std=options.std,
        eps=options.eps,
        valid=torch.tensor(step_valid, dtype=torch.bool),
    )
    out, start = [], 0
    for i, traj in enumerate(batch.trajectories):
        n = len(traj.turns)
        out.append(_spread(traj, episode[i] + options.omega * step_adv[start : start + n]))
        start += n
    return out

