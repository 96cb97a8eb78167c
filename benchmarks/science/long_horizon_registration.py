"""Write the long-horizon test's pre-registration (issue 48 item 3) before any counted run.

The registration fixes the setting (the pilot variant the selection rule chose, on its shipped, pinned
base: ``long_horizon_pilot.choose_variant``), the
arms, the seeds, the endpoints, the tests, the decision rule and the power, and records the commit
it was written from. It is written once: the script refuses to overwrite an existing registration;
a change after that is an amendment, appended with ``--amend TEXT`` (dated, never edited away).

    python benchmarks/science/long_horizon_registration.py --steps 150
    python benchmarks/science/long_horizon_registration.py --amend "..."   # dated, appended
    python benchmarks/science/long_horizon_registration.py --training --name long_horizon_r2 \
        --out benchmarks/results/long_horizon_registration_2.json   # after the sixth round
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, provenance_of, resolve, write_json
from protocol import COLLAPSE_RULE, ESCAPE_RULE
from stats import detectable_difference, holm_thresholds

OUT = RESULTS / "long_horizon_registration.json"
ARMS = {
    "grpo": "the baseline: GRPO groups of 8 chains",
    "trace_credit": "TRACE credit in the paper's form (K = 3, w_turn = 0.2, log-ratio values), GRPO groups",
    "trace_credit_k1": "the same with K = 1 (each turn's own readiness change)",
    "trace_alloc_notree": "learned roots without the tree: stage 1 spends the whole budget on chains from the "
                          "roots the success predictor chooses (tree_anchor, which equals GRPO on chains)",
    "trace": "tree + credit: TRACE allocation (learned roots, then learned prefix continuations) with TRACE credit",
}
"""The registered arms (presets of tracerl/config/presets.py), each compared with ``grpo`` on the same seeds."""
SEEDS = list(range(12))
POWER_SDS = {
    "trace_credit minus GRPO, look-alike testbed (12 seeds)": ("sample_efficiency_credit_lookalike.json",
                                                               ("methods", "trace_credit", "paired_vs_grpo")),
    "trace_credit minus GRPO, credit testbed (7 seeds)": ("sample_efficiency_trace_options_credit.json",
                                                          ("methods", "trace_credit", "paired_vs_grpo")),
    "trace_alloc minus GRPO, credit testbed (7 seeds)": ("sample_efficiency_mechanisms_credit.json",
                                                         ("methods", "trace_alloc", "paired_vs_grpo")),
    "learned roots minus GRPO at lr 1e-3, credit testbed (7 seeds)": ("lr_controls.json",
                                                                      ("comparisons", "learned roots minus GRPO at lr 1e-3")),
}
"""Paired standard deviations of sampled success (all hops) measured on the earlier testbeds: the
spreads the power table assumes (none is from the long-horizon testbed, where no arm has run)."""


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pilot", type=Path, default=RESULTS / "long_horizon_pilot_round5.json",
                   help="The pilot JSON holding the variant's statistics and step costs.")
    p.add_argument("--round", choices=("clues", "turns", "exact", "lr3e4", "clues2x", "clues5"), default="lr3e4",
                   help="The pilot round whose rule chooses.")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", help="Learning rate of every arm (default 1e-3; a round that trained its pilots: "
                                "their rate, long_horizon_pilot.TRAINED_ROUNDS, and no other).")
    p.add_argument("--training", action="store_true",
                   help="Take the learning rate and steps from the sixth round's pilot GRPO runs (replaces --lr, --steps).")
    p.add_argument("--learning", action="store_true",
                   help="The seventh round: register at --lr/--steps when a pilot arm learned there; no GRPO precondition.")
    p.add_argument("--name", default="long_horizon", help="The shards' file prefix (results/<name>_shard_<arm>_s<seed>.json).")
    p.add_argument("--amend", metavar="TEXT", help="Append a dated amendment to the existing registration.")
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args()


def _sd(path: str, keys: tuple[str, ...]) -> float:
    node: Any = json.loads((RESULTS / path).read_text())
    for key in keys:
        node = node[key]
    return float(node["sampled_all"]["sd"])


def power_table(n: int, arms: int) -> list[dict[str, Any]]:
    """The true difference (points of sampled success) found with 80% power by the paired t-test at
    Holm's first and last thresholds over ``arms`` comparisons, for each assumed spread."""
    first, last = holm_thresholds([0.0] * arms)[0], 0.05
    rows = []
    for label, (path, keys) in POWER_SDS.items():
        sd = _sd(path, keys)
        rows.append({"assumed_from": label, "paired_sd_points": round(100 * sd, 2),
                     "detectable_at_first_holm_step_points": round(100 * detectable_difference(sd, n, first), 2),
                     "detectable_at_alpha_0.05_points": round(100 * detectable_difference(sd, n, last), 2)})
    return rows


def last_wins(overrides: list[str]) -> list[str]:
    """``overrides`` with each key once, at its last value (the one a config resolves to), in first-seen order."""
    last = {item.split("=", 1)[0]: item for item in overrides}  # a dict keeps each key's first position
    return list(last.values())


def registered_lr(round_name: str, lr: str | None) -> str:
    """Every arm's learning rate: a round that trained its pilots registers at their rate (a different
    ``lr`` is refused); any other round at ``lr`` (default 1e-3)."""
    import long_horizon_pilot as pilot

    trained = pilot.TRAINED_ROUNDS.get(round_name)
    if trained is not None and lr is not None and float(lr) != float(trained):
        raise SystemExit(f"--lr {lr}: round {round_name}'s pilots trained at {trained}; its test is registered at that rate")
    return trained or lr or "1e-3"


def _results(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def choose_setting(args: argparse.Namespace, rows: dict[str, Any], costs: dict[str, Any], lr: str) -> str:
    """The variant the round's rule (``long_horizon_pilot``) chooses; exits saying what must run first,
    or that no test is registered."""
    import long_horizon_pilot as pilot

    unmeasured = [name for name in pilot.ROUNDS[args.round] if name not in rows]
    if unmeasured and args.round != "clues5":  # the ninth round decides base by base (below)
        raise SystemExit(f"{args.pilot}: no base statistics of {', '.join(unmeasured)} (round {args.round}) yet: "
                         f"long_horizon_pilot.py --variants {' '.join(unmeasured)} "
                         f"--out benchmarks/results/long_horizon_pilot_{args.round}.json, then --pilot that file")
    flips_next = (f"long_horizon_pilot.py --variants {{}} --step-cost 40 --methods trace_credit trace_credit_k1 "
                  f"--seed 1 --set optim.lr={lr} --out {args.pilot}")
    if args.round in pilot.GRPO_ROUNDS:  # the eighth and ninth rounds: base rates, a pilot GRPO run that learns, a flip
        grpo = {name: sweep for name in pilot.ROUNDS[args.round]
                if (sweep := _results(pilot.grpo_pilot_file(name, args.round))) is not None}
        variant, todo = (pilot.choose_base_by_base(rows, costs, grpo, pilot.ROUNDS[args.round]) if args.round == "clues5"
                         else pilot.choose_with_grpo(rows, costs, grpo, pilot.ROUNDS[args.round], args.round))
        if todo and todo[0][0] == "measure":
            names = " ".join(name for _, name in todo)
            raise SystemExit(f"{args.pilot}: no base statistics of {names} yet: long_horizon_pilot.py --variants {names} "
                             f"--out benchmarks/results/long_horizon_pilot_{args.round}_<base>.json, then --pilot a file "
                             "holding every measured variant")
        if todo:
            kind, name = todo[0]
            sets = " ".join(f"--set {k}" for k in pilot.sweep_sets(name))
            raise SystemExit(f"round {args.round} needs {kind} of {name} first: " + (
                f"sample_efficiency.py --setting long --steps 150 --methods grpo --seed-list 100 {sets} "
                f"--set optim.lr={lr} --out benchmarks/results/{pilot.grpo_pilot_file(name, args.round)}"
                if kind == "grpo" else flips_next.format(name)))
    elif args.round in pilot.TRAINED_ROUNDS:
        variant, pending = pilot.choose_with_training(rows, costs, pilot.ROUNDS[args.round])
        if pending:
            raise SystemExit(f"{args.pilot}: the rule needs pilot training steps of {pending[0]} first: "
                             + flips_next.format(pending[0]))
    else:
        variant = pilot.choose_variant(rows, pilot.ROUNDS[args.round])
    if variant is None:
        raise SystemExit(f"{args.pilot}: no variant of round {args.round} meets every requirement: no test is registered")
    return variant


def sixth_round() -> tuple[str, int, dict[str, Any]]:
    """The learning rate and steps the sixth round's pilot GRPO runs chose, with their record."""
    import long_horizon_pilot as pilot

    sweeps = {c: sweep for c in pilot.TRAINING_CANDIDATES if (sweep := _results(pilot.training_file(*c))) is not None}
    picked, todo = pilot.choose_training(sweeps)
    if todo:
        lr, steps = todo[0]
        raise SystemExit(f"the sixth round needs its pilot GRPO run at lr {lr} for {steps} steps first "
                         f"(sample_efficiency.py --setting long --methods grpo --seed-list 100 --steps {steps} "
                         f"--set optim.lr={lr} --out benchmarks/results/{pilot.training_file(lr, steps)})")
    if picked is None:
        raise SystemExit("no candidate of the sixth round made GRPO learn: no test is registered")
    return picked[0], picked[1], {
        "rule": "long_horizon_pilot.choose_training (sixth round, written before it ran)",
        "runs": {pilot.training_file(*c): {"lr": c[0], "steps": c[1], "git": sw.get("git"),
                                           "grpo_sampled_gain_points": round(100 * pilot.grpo_gain(sw), 2)}
                 for c, sw in sweeps.items()}}


def seventh_round(lr: str, steps: int) -> dict[str, Any]:
    """The record of the seventh round's pilot arms, when one of them learned (else exits)."""
    import long_horizon_pilot as pilot

    sweeps = {arm: sweep for arm in pilot.LEARNING_ARMS if (sweep := _results(pilot.learning_file(arm))) is not None}
    arm, todo = pilot.choose_learning_arm(sweeps)
    if arm is None and todo:
        raise SystemExit(f"the seventh round needs its pilot run of {todo[0]} first (sample_efficiency.py "
                         f"--setting long --methods {todo[0]} --seed-list 100 --steps {steps} "
                         f"--set optim.lr={lr} --out benchmarks/results/{pilot.learning_file(todo[0])})")
    if arm is None:
        raise SystemExit("no arm of the seventh round learned: no test is registered")
    return {"rule": "long_horizon_pilot.choose_learning_arm (seventh round, written before it ran)", "learned": arm,
            "runs": {pilot.learning_file(a): {"sampled_gain_points": round(100 * pilot.arm_gain(sw, a), 2),
                                              "git": sw.get("git")} for a, sw in sweeps.items()}}


def registration(args: argparse.Namespace) -> dict[str, Any]:
    import long_horizon_pilot as pilot

    data = json.loads(args.pilot.read_text())
    rows, costs = data["variants"], data.get("step_cost", {})
    lr = flip_lr = registered_lr(args.round, args.lr)
    variant = choose_setting(args, rows, costs, lr)
    chosen, steps, training, learning = rows[variant], args.steps, None, None
    if args.training:  # the sixth round: GRPO's learning rate and length
        lr, steps, training = sixth_round()
    if args.learning:  # the seventh round: any arm learning in a seed-100 pilot at this training
        learning = seventh_round(lr, steps)
    setting = last_wins(pilot.LONG_BASE + pilot.VARIANTS[variant] + [f"optim.lr={lr}"])
    config = resolve("grpo", setting, False)
    base = provenance_of(config)
    cost = costs.get(variant, {})
    return {
        "registered": datetime.date.today().isoformat(),
        "status": "registered before any counted run; the analysis below is the one the verdict uses",
        "question": "Where episodes need four or five tool calls and the gold is in context one search before the last, "
                    "does TRACE credit (paper's K and K = 1), learned roots without the tree, or the tree with "
                    "credit change held-out success against GRPO?",
        "setting": {"variant": variant, "overrides": setting, "lr": lr, "steps": steps,
                    "command": f"sample_efficiency.py --setting long --steps {steps} --set optim.lr={lr}"
                               + "".join(f" --set {k}" for k in pilot.sweep_sets(variant)),
                    "budget": "64 rollouts a step: 8 prompts x 8 for GRPO, from a pool of 16; every arm the same budget",
                    "pilot": {"file": str(args.pilot.relative_to(RESULTS.parent.parent)),
                              "greedy": chosen["greedy"], "sampled": chosen["sampled"],
                              "credit": {k: v for k, v in chosen["credit"].items() if k != "measure"}},
                    "selection_round": args.round,
                    "selection_rule": ("long_horizon_pilot.py's docstring (ninth round), written before the round ran: "
                                       "among the variants meeting the three base requirements, the 6,300-step base's "
                                       "first, within a base the widest greedy minus sampled gap first, the first whose "
                                       "seed-100 pilot GRPO run gains 2 points of sampled success and whose pools or 40 "
                                       f"pilot training steps of a credit arm at lr {flip_lr} show a sign flip"
                                       if args.round == "clues5" else
                                       "long_horizon_pilot.py's docstring, written before the round ran: among the "
                                       "round's variants meeting every requirement, the one whose sampled success is "
                                       "nearest 6.5%, ties in the round's order"
                                       + (f"; the sign-flip requirement may be met in 40 pilot training steps of a "
                                          f"credit arm at lr {flip_lr}" if args.round in pilot.TRAINED_ROUNDS else "")),
                    **({"training": training} if training else {}),
                    **({"learning": learning} if learning else {})},
        "base": base,
        "arms": ARMS,
        "seeds": SEEDS,
        "shards": f"one arm of one seed per shard (results/{args.name}_shard_<arm>_s<seed>.json); a crashed run is "
                  "re-run on its seed; no seed is dropped",
        "precondition": ("none that stops the test: the selection rule already required GRPO to gain 2 points in a "
                         "seed-100 pilot, and one counted seed is too noisy a gate (the first registration stopped on "
                         "one); GRPO's gain over the base model across the 12 seeds is reported with its t-interval "
                         "beside the verdict, and the verdict says so if that interval includes zero"
                         if args.round == "clues5" else
                         "none: the pilots found no training at which GRPO learns here, and the test asks whether "
                         "another arm moves success where GRPO barely does (seventh pilot round); seed 0 is read only "
                         "with the other seeds" if learning else
                         "GRPO must learn: on seed 0 its final sampled success (all questions) is at least the base "
                         "model's plus 2 points on the same questions; if not, the test is not run as written and a "
                         "new registration follows"),
        "endpoints": {"primary": "held-out sampled success after the last step: 300 unseen-world questions x 4 samples "
                                 "at the rollout temperature; per seed, arm minus GRPO",
                      "secondary": "held-out greedy success after the last step (200 unseen-world questions), the "
                                   "same pairing"},
        "tests": "per endpoint: two-sided paired t-test on the 12 differences and the exact sign-flip test of their "
                 "mean (all 4,096 sign assignments); Holm's correction over the four arm comparisons at a family "
                 "alpha of 0.05 (t-test p-values); reported: the mean difference with its 95% t-interval",
        "decision_rule": "an arm is higher or lower than GRPO on an endpoint only when its t-test passes Holm's "
                         "procedure and its sign-flip p-value is at most the same Holm step; otherwise unresolved "
                         "at this size (protocol.decide; the merged JSON records it as decision)",
        "descriptive_only": ["sign flips of the turn term in mixed groups", "mean tool calls and turns",
                             "effective ratio", COLLAPSE_RULE, ESCAPE_RULE, "wall time per step"],
        "power": {"method": "Monte Carlo paired t-test (stats.paired_t_power), 80% power, n = 12",
                  "holm_first_step": holm_thresholds([0.0] * (len(ARMS) - 1))[0],
                  "rows": power_table(len(SEEDS), len(ARMS) - 1)},
        "compute": {"pilot_step_seconds": {m: c.get("step_seconds_median") for m, c in cost.items()
                                           if isinstance(c, dict)},
                    "note": "one core a process; credit arms score readiness after every search"},
        "amendments": [],
    }


def main() -> None:
    args = _args()
    if args.amend:
        data = json.loads(args.out.read_text())
        data["amendments"].append({"date": datetime.date.today().isoformat(), "text": args.amend})
        write_json(args.out, data)
        print(f"amended {args.out}")
        return
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: a registration is written once (use --amend)")
    write_json(args.out, registration(args))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
