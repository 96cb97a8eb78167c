"""The names tracerl registers in verl (no verl import, so the check can read them when the
plug-in itself fails to import)."""

ESTIMATOR_NAMES = {"tracerl_trace_credit": "trace_credit", "tracerl_tree_anchor": "tree_anchor"}
"""verl's estimator name (``algorithm.adv_estimator``) -> tracerl's estimator."""
ROLLOUT_NAME = "tracerl_hf"
"""verl's ``actor_rollout_ref.rollout.name`` of tracerl's HF rollout server (:mod:`.hf_rollout`)."""
TRAINER_NAME = "tracerl_sync"
"""verl's trainer name (``trainer.v1.trainer_mode``)."""
INSTALL = "pip install -e '.[verl]'"
