"""TRACE inside verl 0.9.1 (the ``verl`` extra: ``pip install -e '.[verl]'``).

* :mod:`.rows`: tracerl trees <-> verl rows and their tree fields (imports no verl);
* :mod:`.estimators`: ``tracerl_trace_credit`` and ``tracerl_tree_anchor`` for verl's
  ``register_adv_est``;
* :mod:`.trainer`: the ``tracerl_sync`` trainer, verl's sync trainer whose advantage step hands
  the tree fields to the estimator;
* :mod:`.hf_rollout`: ``tracerl_hf``, tracerl's HF backend as a verl rollout server (replica,
  server actor, weight-sync adapter);
* :mod:`.plugin`: the ``verl.plugins`` entry point (imported in every verl process): it imports
  nothing heavy and registers all three when verl imports the registries they go into;
* :mod:`.cpu`: verl on the CPU (a platform class and the few verl internals it adapts), loaded
  through ``VERL_USE_EXTERNAL_MODULES`` with ``VERL_PLATFORM=cpu``;
* :mod:`.check`: the start-up check, because verl hides plug-in import errors;
* :mod:`.registrations`: what verl's registries lack of tracerl's names (the trainer's refusal);
* :mod:`.server_policy`: ``VerlServerPolicy``, a tracerl policy backend over verl's ``LLMServerClient``;
* :mod:`.leaves`: tree leaves as TransferQueue samples, each with its own reward;
* :mod:`.manager`: ``TraceAgentLoopManager``, TRACE as verl's ``agent_loop_manager_class``;
* :mod:`.settings`: the manager's start-up checks (verl settings refused in one line, tracerl
  settings verl's config owns: model path, tokenizer, optimiser) and its failure settings;
* :mod:`.predictor_io`: the predictor's file in verl's checkpoint (read with ``weights_only``);
* :mod:`.readiness`: where the frozen reference scores readiness (``+tracerl.readiness``) and the
  tokens each place forwards; :mod:`.reference` (verl's reference worker) and
  :mod:`.readiness_servers` (frozen-reference servers the ``tracerl_sync`` trainer starts).

This package's ``__init__`` imports nothing, so :mod:`.rows` stays usable without verl.
"""
