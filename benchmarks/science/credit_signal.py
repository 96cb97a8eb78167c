"""Is the reference's readiness a useful turn signal in the testbed? (issue 13, reading item 3)

TRACE credit rests on one premise: a tool call that brings the answer closer raises the frozen
reference's readiness ``l_k`` for the gold answer, so the TD reward ``delta_k`` is positive on
useful calls and not on useless ones. This script checks that premise on the testbed's base
model (the trained-from policy, which is also the reference), with no training, and measures how
the dense term meets the outcome term in the token advantage:

- ``useful_vs_not``: per transition (a search), ``delta_k`` (value form ``--form``) when the
  search brought a supporting document of the question not seen before in the episode ("useful")
  against every other transition, and the AUC of ``delta_k`` for telling them apart;
- ``final_value_auc``: AUC of ``V_T`` (the value after the last search) for telling successful
  episodes from failed ones, over episodes with at least one search;
- ``advantage_mixed_groups``: per transition of an episode with a non-zero outcome advantage, the outcome term
  ``w_out * A_out`` against the turn term ``w_turn * c_k`` (terminal fill included): mean absolute
  sizes and signed means, and the share of transitions where the turn term flips the sign of the
  total, split by success and failure;
- ``advantage_all_same_groups``: the transitions of groups whose rewards are all equal (``A_out = 0``:
  GRPO trains nothing there, the dense term still does): their share, and the turn term's size,
  signed mean and share of positive values.

Rollouts come from the trace_credit preset in the sweep's setting (``common.BENCH_SETTING``,
chains of 8 per prompt, the sweep's budget) for ``--steps`` pools of training questions, scored
by the trainer's own reference call; no update runs.

    python benchmarks/science/credit_signal.py   # 4 pools x 64 episodes: about 1 min on one core
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, configure_torch, fresh_dir, machine, mean, provenance_of, resolve, write_json
from sample_efficiency import sweep_overrides

from tracerl.allocation.predictor import weighted_auc
from tracerl.core.credit import prefix_values
from tracerl.core.tree_advantages import trajectory_turn_credit, tree_outcome_turn_advantages
from tracerl.core.types import Trajectory


def auc(positive: list[float], negative: list[float]) -> float | None:
    """P(a positive scores above a negative), ties counting one half (the predictor's
    :func:`~tracerl.allocation.predictor.weighted_auc`, unit weights); None without both kinds."""
    if not positive or not negative:
        return None
    ones, zeros = [1.0] * len(positive), [0.0] * len(negative)
    return float(weighted_auc(positive + negative, ones + zeros, [0.0] * len(positive) + [1.0] * len(negative)))


def useful_transitions(traj: Trajectory, supporting: tuple[str, ...]) -> list[bool]:
    """Per transition: did its observation bring a supporting document not seen before in the episode?"""
    seen: set[str] = set()
    out = []
    for turn in (t for t in traj.turns if t.is_transition):
        if turn.tool_error or turn.action.kind == "invalid":  # an error message, no documents
            out.append(False)
            continue
        titles = {line.split(":", 1)[0].strip() for line in turn.observation.split("\n") if ":" in line}
        out.append(bool((titles & set(supporting)) - seen))
        seen |= titles
    return out


def measure(trajectories: list[Trajectory], tasks: dict[str, Any], outcome: list[float], options: Any,
            form: str) -> dict[str, Any]:
    options = replace(options, credit_value=form)
    useful, other, final_ok, final_bad = [], [], [], []
    rows: list[tuple[bool, float, float]] = []  # (success, outcome term, turn term) per transition
    for i, traj in enumerate(trajectories):
        if traj.infra_failed or traj.readiness is None or traj.num_transitions == 0:
            continue
        values = prefix_values(torch.tensor(traj.readiness, dtype=torch.float64), form, options.credit_eps)
        deltas = (values[1:] - values[:-1]).tolist()
        for delta, good in zip(deltas, useful_transitions(traj, tasks[traj.task_id].supporting_titles), strict=True):
            (useful if good else other).append(delta)
        (final_ok if traj.reward > 0.5 else final_bad).append(float(values[-1]))
        credit = trajectory_turn_credit(traj, outcome[i], options).tolist()
        rows += [(traj.reward > 0.5, options.w_out * outcome[i], options.w_turn * c) for c in credit]

    def flips(part: list[tuple[bool, float, float]]) -> float | None:
        return mean([float(np.sign(o + t) != np.sign(o)) for _, o, t in part]) if part else None

    mixed = [r for r in rows if r[1] != 0]
    same = [r for r in rows if r[1] == 0]  # groups whose rewards are all equal: GRPO trains nothing there
    return {
        "transitions": len(useful) + len(other),
        "useful_vs_not": {"useful": len(useful), "other": len(other), "delta_mean_useful": mean(useful),
                          "delta_mean_other": mean(other), "auc": auc(useful, other)},
        "final_value_auc": {"successes": len(final_ok), "failures": len(final_bad), "auc": auc(final_ok, final_bad),
                            "value_mean_success": mean(final_ok), "value_mean_failure": mean(final_bad)},
        "advantage_mixed_groups": {
            "transitions": len(mixed), "outcome_term_abs_mean": mean([abs(o) for _, o, _ in mixed]),
            "turn_term_abs_mean": mean([abs(t) for _, _, t in mixed]),
            "outcome_term_mean": mean([o for _, o, _ in mixed]), "turn_term_mean": mean([t for _, _, t in mixed]),
            "sign_flip_share_success": flips([r for r in mixed if r[0]]),
            "sign_flip_share_failure": flips([r for r in mixed if not r[0]])},
        "advantage_all_same_groups": {
            "transitions": len(same), "share_of_transitions": len(same) / len(rows) if rows else None,
            "turn_term_abs_mean": mean([abs(t) for _, _, t in same]), "turn_term_mean": mean([t for _, _, t in same]),
            "turn_term_positive_share": mean([float(t > 0) for _, _, t in same])},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4, help="Pools of training questions (16 prompts x 8 chains each).")
    p.add_argument("--setting", choices=("bench", "credit", "lookalike"), default="bench",
                   help="sample_efficiency.py's setting the rollouts come from (lookalike: does readiness separate "
                        "useful searches from look-alike ones?).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/tracerl-credit-signal"))
    p.add_argument("--out", type=Path, default=RESULTS / "credit_signal.json")
    args = p.parse_args()
    configure_torch(args.threads)
    from tracerl.core.advantages import AdvantageBatch
    from tracerl.core.seeds import derive_seed
    from tracerl.allocation.session import RolloutSession
    from tracerl.train.data import take_pool
    from tracerl.train.loop import Trainer

    clock = time.perf_counter()
    knobs = argparse.Namespace(setting=args.setting, quick=False, smoke=False, hard=False, dev_model=False, overrides=[])
    overrides = sweep_overrides(knobs) + [f"seed={args.seed}"]
    config = resolve("trace_credit", overrides, False)
    trainer = Trainer(config, fresh_dir(args.work_dir))
    tasks = {t.id: t for t in trainer.data.train}
    options = config.algo.advantage
    cursor, trajectories, outcome = 0, [], []
    for step in range(args.steps):
        pool = take_pool(trainer.data.train, cursor, config.rollout.pool_size)
        session = RolloutSession(trainer.executor, derive_seed(config.seed, "step", step))
        result = trainer.scheme.collect(session, pool, config.rollout.budget, trainer.generator)
        cursor += result.consumed
        session.score(result.trees)
        trajs = [t for tree in result.trees for t in tree.trajectories.values()]
        _, group_adv = tree_outcome_turn_advantages(AdvantageBatch(trajs, {t.tree_id: t for t in result.trees}),
                                                    options)
        trajectories += trajs
        outcome += [float(a) for a in group_adv]
        session.forget()
    data = {
        "setting": {"preset": "trace_credit", "overrides": overrides, "steps": args.steps,
                    "episodes": len(trajectories), "policy": "base weights (bench_hops), no update",
                    "w_out": options.w_out, "w_turn": options.w_turn, "horizon": options.horizon},
        "success_rate": mean([float(t.reward > 0.5) for t in trajectories]),
        "forms": {form: measure(trajectories, tasks, outcome, options, form)
                  for form in ("log_ratio", "raw_diff", "remaining_gap")},
        "seconds": time.perf_counter() - clock, **machine(), "provenance": provenance_of(config),
    }
    write_json(args.out, data)
    for form, m in data["forms"].items():
        u, f, a, z = m["useful_vs_not"], m["final_value_auc"], m["advantage_mixed_groups"], m["advantage_all_same_groups"]
        print(f"{form:>13}: delta useful {u['delta_mean_useful']:.3f} vs other {u['delta_mean_other']:.3f} "
              f"(AUC {u['auc']:.3f}, {u['useful']}/{u['other']}); V_T AUC for success {f['auc']:.3f}; mixed groups: "
              f"|outcome| {a['outcome_term_abs_mean']:.3f} |turn| {a['turn_term_abs_mean']:.3f} turn mean "
              f"{a['turn_term_mean']:+.3f}, sign flips {a['sign_flip_share_success']:.3f} (success) "
              f"{a['sign_flip_share_failure']:.3f} (failure); all-same groups: {z['share_of_transitions']:.2f} of "
              f"transitions, |turn| {z['turn_term_abs_mean']:.3f}, mean {z['turn_term_mean']:+.3f}")
    print(f"wrote {args.out} ({data['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
