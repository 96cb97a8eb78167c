"""verl's ``verl.plugins`` entry point. verl imports it on ``import verl``, in every process (its
vLLM servers' included), so it imports nothing heavy: it only registers post-import hooks
(wrapt's ``register_post_import_hook``) that register tracerl's names when verl imports the
registry they go into, and not before:

* ``verl.trainer.ppo.core_algos`` (``register_adv_est``): the two estimators (:mod:`.estimators`);
* ``verl.trainer.ppo.v1``, whose ``__init__`` loads every trainer and ``get_trainer_cls``: the
  ``tracerl_sync`` trainer (:mod:`.trainer`, which imports TransferQueue and verl's trainer);
* ``verl.workers.rollout.replica`` and ``verl.workers.rollout.base``: ``tracerl_hf``'s replica
  loader and its adapter's import path (:mod:`.hf_rollout` loads when verl asks for ``tracerl_hf``).

A hook whose import fails logs one warning and registers nothing, as verl treats a failing
plug-in; :func:`~.check.check_registrations` then names the error in one line.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import wrapt

from tracerl.integrations.verl.names import ROLLOUT_NAME

_log = logging.getLogger(__name__)

ADAPTER = "tracerl.integrations.verl.hf_rollout.HFServerAdapter"
"""``tracerl_hf``'s adapter in verl's table of rollout adapters (verl imports it by this path)."""


def _replica() -> Any:
    """verl's loader of the ``tracerl_hf`` replica class (called when a run names it)."""
    from tracerl.integrations.verl.hf_rollout import HFReplica

    return HFReplica


def _importing(module: str) -> Any:
    def hook(_: Any) -> None:
        try:
            importlib.import_module(module)  # registers on import
        except Exception as err:  # verl swallows plug-in errors too; the start-up check names it
            _log.warning("tracerl's verl plug-in could not import %s: %s: %s", module, type(err).__name__, err)

    return hook


def _replica_hook(replica: Any) -> None:
    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica)


def _adapter_hook(base: Any) -> None:
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER


wrapt.register_post_import_hook(_importing("tracerl.integrations.verl.estimators"), "verl.trainer.ppo.core_algos")
wrapt.register_post_import_hook(_importing("tracerl.integrations.verl.trainer"), "verl.trainer.ppo.v1")
wrapt.register_post_import_hook(_replica_hook, "verl.workers.rollout.replica")
wrapt.register_post_import_hook(_adapter_hook, "verl.workers.rollout.base")
