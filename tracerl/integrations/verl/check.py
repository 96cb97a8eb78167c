"""The start-up check: verl logs a plug-in's import error only at DEBUG level, so a missing or
broken install would surface later as "Unknown advantage estimator". Call
:func:`check_registrations` first; it fails with one line saying what is missing and how to
install."""

from __future__ import annotations

import importlib

from tracerl.errors import UserError

from tracerl.integrations.verl.names import ESTIMATOR_NAMES, INSTALL, TRAINER_NAME


def missing_registrations() -> list[str]:
    """Names of tracerl's estimators and trainer that verl's registries do not hold."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    missing = [n for n in ESTIMATOR_NAMES if n not in ADV_ESTIMATOR_REGISTRY]
    return missing + ([] if TRAINER_NAME in TRAINER_REGISTRY else [TRAINER_NAME])


def check_registrations() -> None:
    """Raise :class:`UserError` (one line) unless verl loaded tracerl's plug-in."""
    import verl  # noqa: F401  (loads the verl.plugins entry points)

    missing = missing_registrations()
    if not missing:
        return
    try:
        importlib.import_module("tracerl.integrations.verl.plugin")
        why = "the plug-in imports here, so verl did not find its entry point"
    except Exception as err:  # the error verl logged at DEBUG level
        why = f"its import fails: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    raise UserError(f"verl has not registered tracerl's {', '.join(missing)} ({why}); install with {INSTALL}")
