"""What verl's registries lack of tracerl's names, and the one-line refusal when they lack any.

The trainer refuses with :func:`require_registrations`; :func:`~.check.check_registrations`, the
start-up check, adds why verl did not register them (it imports the plug-in, so it sits above
the modules the plug-in loads, and this module below them). verl is imported only inside the
functions.
"""

from __future__ import annotations

from tracerl.errors import UserError
from tracerl.integrations.verl.names import ESTIMATOR_NAMES, INSTALL, TRAINER_NAME

NOT_FOUND = "the plug-in imports here, so verl did not find its entry point"
"""Why verl lacks the names when the plug-in's modules import fine."""


def missing_registrations() -> list[str]:
    """Names of tracerl's estimators and trainer that verl's registries do not hold."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    missing = [n for n in ESTIMATOR_NAMES if n not in ADV_ESTIMATOR_REGISTRY]
    return missing + ([] if TRAINER_NAME in TRAINER_REGISTRY else [TRAINER_NAME])


def refusal(missing: list[str], why: str) -> UserError:
    """The one-line error naming what is ``missing``, ``why`` and how to install."""
    return UserError(f"verl has not registered tracerl's {', '.join(missing)} ({why}); install with {INSTALL}")


def require_registrations() -> None:
    """Raise :class:`UserError` (one line) unless verl's registries hold tracerl's names.

    For the trainer: once its module is loaded, so are the modules the plug-in imports, so what
    failed is verl finding the plug-in's entry point (what :func:`~.check.check_registrations`
    would find)."""
    missing = missing_registrations()
    if missing:
        raise refusal(missing, NOT_FOUND)
