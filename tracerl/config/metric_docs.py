"""The meaning of every key a run writes to ``metrics.jsonl`` (one entry per key or key family).

Adding a metric is one line in :data:`METRICS`: ``Metric("key", "group", "meaning")``. A family
of keys is one pattern with a placeholder: ``{k}`` (or ``{n}``) matches digits, any other
``{name}`` a lower-case identifier (``eval_accuracy_hops{k}``, ``time_{phase}``). The most
specific entry wins (an exact key over a pattern). ``tests/train/test_reference.py`` trains
every preset for a step and fails on a key no entry matches; ``docs/reference.md`` is
generated from this table (``tracerl config reference --out docs/reference.md``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """``pattern``: a key or a key family; ``group``: the reference's section; ``doc``: its meaning."""

    pattern: str
    group: str
    doc: str

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)


@functools.cache
def _compile(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\{\w+\})", pattern)
    body = "".join(("[0-9]+" if p in ("{k}", "{n}") else "[a-z0-9_]+") if p.startswith("{") else re.escape(p)
                   for p in parts if p)
    return re.compile(f"^{body}$")


METRICS: tuple[Metric, ...] = (
    # --- training batch
    Metric("step", "training", "Training step this record closes (0: the `eval.at_start` evaluation)."),
    Metric("reward_mean", "training", "Mean terminal reward of the step's trajectories (infrastructure failures left out)."),
    Metric("accuracy", "training", "Share of the step's trajectories with reward > 0.5."),
    Metric("effective_ratio", "training", "Share of the step's prompts (groups, a prompt's leaves over all its trees) whose rewards are mixed: a success and a failure (spec section 1: only they carry a learning signal); `scheme_mixed_prompts` over `scheme_prompts`."),
    Metric("rollouts", "training", "Continuation rollouts spent this step (the budget unit)."),
    Metric("generated_tokens", "training", "Tokens the policy generated this step (forced observation tokens not counted)."),
    Metric("total_rollouts", "training", "Rollouts since step 1 (the x axis of sample-efficiency curves)."),
    Metric("total_generated_tokens", "training", "Generated tokens since step 1."),
    Metric("prompts", "training", "Rollout trees (prompts) of the step."),
    Metric("trajectories", "training", "Trajectories (root-to-leaf episodes) of the step."),
    Metric("infra_failed", "training", "Trajectories whose tool call failed (raised, exited, timed out): left out of the loss."),
    Metric("turns_mean", "training", "Mean assistant turns per trajectory."),
    Metric("tool_calls", "training", "Tool calls made this step."),
    Metric("tool_failures", "training", "Tool calls that failed this step (infrastructure failures)."),
    Metric("readiness_gain_mean", "credit", "Mean l_T - l_0 over trajectories: how much the episode raised the frozen reference's readiness (log-prob of the gold answer); null without `algo.credit`."),
    Metric("valid_action_rate", "training", "Share of the turns of valid trajectories whose action parsed and was accepted (divergence check: falling to 0 and staying there is a collapse)."),
    Metric("sampled_entropy", "training", "Mean negative log-prob of the sampled tokens, nats (divergence check: rising towards ln(vocabulary) means near-uniform sampling)."),
    Metric("credit_allsame_turn_mean", "credit", "trace_credit: mean of the paper's turn term w_turn c_k over transitions of all-same groups, where it is the only gradient (NaN without such transitions)."),
    Metric("credit_allsame_turn_pos", "credit", "trace_credit: share of those turn terms that are positive."),
    Metric("credit_turn_outcome_cos", "credit", "trace_credit: cosine between the per-token turn-term and outcome-term advantage vectors as trained, over sampled tokens (a direction of the advantages, not of gradients)."),
    Metric("credit_mixed_flip_share", "credit", "trace_credit: share of the transitions of mixed groups (outcome term not 0) whose turn term, as trained, flips the outcome term's sign: how often turn credit overrides the outcome (NaN without such transitions)."),
    Metric("stratum_share_{stratum}", "scheme", "Share of the step's trained prompts in one stratum (hop count `hops{k}` where tasks know it, else a predicted-value quartile `v{k}`); a starved stratum warns once."),
    Metric("stratum_rollouts_{stratum}", "scheme", "Share of the step's valid rollouts spent on one stratum."),
    Metric("stratum_success_{stratum}", "scheme", "Success rate (reward > 0.5) of the step's rollouts in one stratum."),
    Metric("stratum_pred_{stratum}", "scheme", "Mean predicted root value of the stratum's trained prompts before this step's update (calibration: compare with stratum_success)."),
    # --- update
    Metric("loss", "update", "Policy loss of the step (mean over `optim.updates_per_step` optimiser steps)."),
    Metric("kl", "update", "k3 KL to the frozen reference (0 unless `optim.kl_coef > 0`)."),
    Metric("clip_fraction", "update", "Share of trained tokens whose importance ratio was clipped."),
    Metric("grad_norm", "update", "Global gradient norm before clipping."),
    Metric("trained_tokens", "update", "Tokens with a loss (sampled tokens of trajectories with non-zero advantage)."),
    Metric("update_forward_tokens", "update", "Tokens the update forwarded (without padding): each leaf's whole "
           "sequence, or with optim.tree_packing each distinct prefix of a micro-batch once."),
    Metric("unique_trained_tokens", "update", "Distinct tokens with a loss: a token the leaves of a packed tree share "
           "counts once (without packing it equals trained_tokens)."),
    Metric("lr", "update", "Learning rate after this step's scheduler update."),
    Metric("nonfinite_skipped", "update", "Optimiser steps skipped this step for a non-finite loss or gradient norm."),
    Metric("nonfinite_skipped_total", "update", "Training steps with a skipped update since step 1 (`optim.max_nonfinite_steps` in a row stop the run)."),
    Metric("scaler_skipped", "update", "float16 only: optimiser steps the gradient scaler skipped on overflow."),
    Metric("logprob_mismatch_mean_abs", "update", "Mean |sampler - trainer| log-prob of sampled tokens, when old log-probs are recomputed (`optim.recompute_old_logprobs`)."),
    Metric("logprob_mismatch_max", "update", "Largest |sampler - trainer| log-prob of a sampled token, when recomputed."),
    # --- rollout scheme (prefix scheme_)
    Metric("scheme_prompts", "scheme", "Prompt groups the scheme returned."),
    Metric("scheme_mixed_prompts", "scheme", "Groups with both successes and failures (the numerator of `effective_ratio`)."),
    Metric("scheme_leaves", "scheme", "Terminal leaves (trajectories) over all groups."),
    Metric("scheme_informative_leaves", "scheme", "Leaves in mixed groups (rollouts with a learning signal; `effective_ratio` counts the groups, not their leaves)."),
    Metric("scheme_success_rate", "scheme", "Share of leaves with reward > 0.5."),
    Metric("scheme_dropped_groups", "scheme", "dapo: sampled groups dropped for uniform rewards (DAPO's dynamic sampling)."),
    Metric("scheme_stage1_prompts", "scheme", "trace: prompts chosen in stage 1 (roots)."),
    Metric("scheme_stage1_rollouts", "scheme", "trace: rollouts spent on the chosen roots."),
    Metric("scheme_stage2_rollouts", "scheme", "trace: rollouts spent continuing turn prefixes (stage 2)."),
    Metric("scheme_anchors", "scheme", "trace: turn prefixes (anchors) that stage 2 expanded."),
    Metric("scheme_explore_prompts", "scheme", "trace: stage-1 prompts drawn uniformly (`rollout.schemes.trace_explore_fraction`), not by the predictor."),
    Metric("scheme_root_topup", "scheme", "trace: budget stage 2 could not place, spent as extra root rollouts."),
    # --- success predictor (prefix predictor_, TRACE allocation)
    Metric("predictor_n_nodes", "predictor", "Nodes of this step's trees the success predictor learned from."),
    Metric("predictor_brier", "predictor", "Brier score of the predictor's values on this step's nodes, before it learned from them."),
    Metric("predictor_auc", "predictor", "AUC of those values against the nodes' outcomes (null when all outcomes agree)."),
    Metric("predictor_loss", "predictor", "The predictor's training loss on its replay buffer."),
    Metric("predictor_buffer", "predictor", "Nodes in the predictor's replay buffer."),
    Metric("predictor_prior", "predictor", "The predictor's prior success rate (what an unseen prompt is given)."),
    # --- evaluation (held-out; only on evaluation steps)
    Metric("eval_accuracy", "evaluation", "Held-out exact match (greedy at `eval.temperature` 0) on `eval.size` tasks."),
    Metric("eval_f1", "evaluation", "Held-out token F1."),
    Metric("eval_turns", "evaluation", "Mean assistant turns per held-out episode."),
    Metric("eval_accuracy_hops{k}", "evaluation", "Held-out exact match on questions of k hops (SynthWiki)."),
    # --- machine (differ between otherwise identical runs)
    Metric("step_seconds", "timing", "Wall time of the step (the sum of its phases)."),
    Metric("time_{phase}", "timing", "Wall seconds of one phase: rollout, scoring, advantages, update, predictor."),
    Metric("time_rollout_execute", "timing", "Executor seconds inside the rollout phase (generation and tools; the rest is planning)."),
    Metric("time_rollout_readiness", "timing", "Reference-scoring seconds inside the rollout phase (trace scores anchors while planning)."),
    Metric("generated_tokens_per_s", "timing", "Generated tokens over executor seconds."),
    Metric("time_sync_weights", "timing", "rollout.executor=ray: seconds pushing the new weights to every rollout worker after the update."),
    Metric("sync_bytes", "timing", "rollout.executor=ray: bytes of weights sent to the workers this step (once per bucket, in the policy's dtype: 2 per parameter for model.dtype=bfloat16)."),
    Metric("sync_s_per_gb", "timing", "rollout.executor=ray: time_sync_weights over sync_bytes in GB (0 without a sync)."),
    Metric("worker_{name}_tokens_per_s", "timing", "rollout.executor=ray: one worker's generated tokens over its executor seconds, over the run so far."),
    Metric("worker_imbalance", "timing", "rollout.executor=ray: the busiest worker's rollouts requested this step over the mean over workers (1.0: even; tasks are placed on the least-loaded worker)."),
    Metric("worker_failures", "training", "rollout.executor=ray: workers lost this step (died or past rollout.request_timeout_s) and replaced; their trees were adopted."),
    Metric("requests_retried", "training", "rollout.executor=ray: requests re-sent to a replacement worker this step (same seeds and branch indices)."),
    Metric("peak_mem_gb_{phase}", "timing", "CUDA only: peak allocated GiB during a phase."),
)
"""Every key of ``metrics.jsonl``; one line per key or family (see the module docstring)."""

GROUPS = ("training", "credit", "update", "scheme", "predictor", "evaluation", "timing")
"""Sections of the generated reference, in order (a new group is added here)."""


def metric_doc(key: str) -> Metric | None:
    """The entry documenting ``key``: an exact entry, else the longest matching pattern."""
    exact = [m for m in METRICS if m.pattern == key]
    if exact:
        return exact[0]
    matching = [m for m in METRICS if m.regex.match(key)]
    return max(matching, key=lambda m: len(m.pattern), default=None)


def undocumented_metrics(keys: set[str] | list[str]) -> list[str]:
    """The keys of ``keys`` no entry documents, sorted."""
    return sorted(k for k in set(keys) if metric_doc(k) is None)
