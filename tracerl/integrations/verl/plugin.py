"""verl's ``verl.plugins`` entry point: importing it registers tracerl's two estimators and the
``tracerl_sync`` trainer (verl imports it on ``import verl``, in every process)."""

from tracerl.integrations.verl import estimators, trainer  # noqa: F401  (registration on import)
