"""The start-up check: verl logs a plug-in's import error only at DEBUG level, so a missing or
broken install would surface later as "Unknown advantage estimator". Call
:func:`check_registrations` first; it fails with one line saying what is missing and how to
install. It imports the plug-in's modules (the entry point registers them as verl imports its
registries) to surface that hidden error, so none of them imports this one (the trainer refuses
through :mod:`.registrations`)."""

from __future__ import annotations

import importlib

from tracerl.integrations.verl.registrations import NOT_FOUND, missing_registrations, refusal


def check_registrations() -> None:
    """Raise :class:`~tracerl.errors.UserError` (one line) unless verl loaded tracerl's plug-in."""
    import verl  # noqa: F401  (loads the verl.plugins entry points)

    missing = missing_registrations()
    if not missing:
        return
    try:
        for module in ("plugin", "estimators", "trainer"):
            importlib.import_module(f"tracerl.integrations.verl.{module}")
        why = NOT_FOUND
    except Exception as err:  # the error verl logged at DEBUG level
        why = f"its import fails: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    raise refusal(missing, why)
