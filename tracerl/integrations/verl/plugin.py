"""verl's ``verl.plugins`` entry point: importing it registers tracerl's two estimators, the
``tracerl_sync`` trainer and the ``tracerl_hf`` rollout server (verl imports it on ``import verl``,
in every process)."""

from tracerl.integrations.verl import estimators, hf_rollout, trainer  # noqa: F401  (registration on import)

hf_rollout.register()
