"""tracerl's estimators under verl's ``register_adv_est`` (verl 0.9.1's calling convention).

verl calls a registered estimator with ``token_level_rewards`` ``[B, W]``, ``response_mask``
``[B, W]``, ``config`` (``algorithm``) and ``index`` (the ``uid`` of each row) and nothing else,
so the tree fields (:data:`~tracerl.integrations.verl.rows.TREE_FIELDS`) arrive one of two ways:

* ``non_tensor_batch=``, where verl passes it to every estimator (verl PR #7473);
* :func:`tree_fields`, a context that the ``tracerl_sync`` trainer's advantage step (or any
  caller of verl's ``compute_advantage``) opens around the call.

The estimator rebuilds tracerl trajectories (:func:`~tracerl.integrations.verl.rows.batch_from_fields`)
and calls ``tracerl.core`` (no second copy of the math). Options come from ``algorithm.tracerl``
(fields of :class:`~tracerl.core.advantages.AdvantageOptions`, e.g.
``+algorithm.tracerl.w_turn=0.2``); verl's ``norm_adv_by_std_in_grpo``, ``gamma`` and ``lam`` are
not read. Returns ``(advantages, returns)``, both ``[B, W]`` float32 and equal, like verl's GRPO.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from torch import Tensor
from verl.trainer.ppo.core_algos import register_adv_est

from tracerl.core.advantages import AdvantageOptions, get_estimator
from tracerl.errors import UserError
from tracerl.integrations.verl.names import ESTIMATOR_NAMES, TRAINER_NAME
from tracerl.integrations.verl.rows import batch_from_fields, pad_rows


_FIELDS: ContextVar[Mapping[str, Any] | None] = ContextVar("tracerl_verl_tree_fields", default=None)


@contextlib.contextmanager
def tree_fields(fields: Mapping[str, Any]) -> Iterator[None]:
    """Hand ``fields`` (the batch's tree fields, B rows each) to the estimators called inside."""
    token = _FIELDS.set(fields)
    try:
        yield
    finally:
        _FIELDS.reset(token)


def options_from(config: Any) -> AdvantageOptions:
    """:class:`AdvantageOptions` from ``config.tracerl`` (a mapping; absent: the defaults)."""
    given = config.get("tracerl", None) if config is not None else None
    if given is None:
        return AdvantageOptions()
    values = dict(given.items())
    known = {f.name for f in dataclasses.fields(AdvantageOptions)}
    for key in values:
        if key not in known:
            raise UserError(f"algorithm.tracerl.{key}: unknown option (known: {', '.join(sorted(known))})")
    try:
        return AdvantageOptions(**values)
    except ValueError as err:
        raise UserError(f"algorithm.tracerl: {err}") from err


def _estimate(name: str, response_mask: Tensor, config: Any, index: Any, non_tensor_batch: Any) -> tuple[Tensor, Tensor]:
    fields = non_tensor_batch if non_tensor_batch is not None else _FIELDS.get()
    if fields is None:
        raise UserError(
            f"{name} needs tracerl's tree fields: run verl with trainer.v1.trainer_mode={TRAINER_NAME} "
            "(or call compute_advantage inside tracerl.integrations.verl.estimators.tree_fields)"
        )
    batch = batch_from_fields(fields, response_mask)
    if index is not None:
        _check_groups(index, [t.tree_id for t in batch.trajectories])
    advantages = get_estimator(ESTIMATOR_NAMES[name])(batch, options_from(config))
    out = pad_rows(advantages, response_mask.shape[1]).to(response_mask.device) * response_mask
    return out, out.clone()


def _check_groups(index: Any, tree_ids: list[str]) -> None:
    """A tree is one group: all its rows must share verl's ``uid``."""
    seen: dict[str, Any] = {}
    for row, (uid, tree_id) in enumerate(zip(list(index), tree_ids, strict=True)):
        if seen.setdefault(tree_id, uid) != uid:
            raise UserError(f"row {row}: tree {tree_id!r} spans two verl uids ({seen[tree_id]!r}, {uid!r})")


@register_adv_est("tracerl_trace_credit")
def tracerl_trace_credit(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None,
    non_tensor_batch: Any = None, **_: Any,
) -> tuple[Tensor, Tensor]:
    """tracerl's ``trace_credit`` (TRACE credit on tree leaves; needs ``tracerl_readiness``)."""
    return _estimate("tracerl_trace_credit", response_mask, config, index, non_tensor_batch)


@register_adv_est("tracerl_tree_anchor")
def tracerl_tree_anchor(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None,
    non_tensor_batch: Any = None, **_: Any,
) -> tuple[Tensor, Tensor]:
    """tracerl's ``tree_anchor`` (group advantage plus the contrast under the nearest branch)."""
    return _estimate("tracerl_tree_anchor", response_mask, config, index, non_tensor_batch)
