"""Step overhead: wall time of a training step by phase, per method, and TRACE over GRPO.

Issue 7 item 4. One trainer per method is built in the same process (same initial model, same
setting as ``sample_efficiency.py``, same seed) and the trainers take their steps interleaved,
round-robin with a rotating order, so load from other processes on the machine hits every
method alike. Phases come from the trainer's ``time_*`` metrics, with the work the ``trace``
rollout scheme does for its allocation moved to the phase it belongs to: reference readiness
scored inside the scheme counts as ``scoring`` and predictor inference inside the scheme counts
as ``predictor``. Both come from the trainer's own record: ``time_rollout_execute`` (executor time
inside the scheme: generation), ``time_rollout_readiness`` (the executor's score calls inside
the scheme); the rest of ``time_rollout`` is the scheme's planning (predictor inference and the
allocation), counted as ``predictor``.

``trace_over_grpo`` (stable key) is the median over rounds of trace's step wall time divided by
grpo's in the same round; ``trace_over_grpo_per_token`` divides seconds per generated token
instead (the methods generate different amounts: trees reuse prefixes), and
``trace_added_phases_over_grpo`` is trace's scoring + predictor time over grpo's step time (what
TRACE adds on top of a rollout and an update). ``update_ms_per_trained_token`` separates the
update's cost from its size: the trainer skips rows whose advantage is zero everywhere, so a
method whose batch carries more signal (mixed groups, dense turn credit) trains more tokens.

    python benchmarks/step_overhead.py --quick   # 7 methods x 3 rounds (first dropped): ~1.5 min on 2 cores
    python benchmarks/step_overhead.py           # 7 methods x 12 rounds (first 2 dropped): ~8 min
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common import (
    RESULTS,
    add_config_args,
    configure_torch,
    describe_config,
    fresh_dir,
    machine,
    mean,
    median,
    resolve,
    save_figure,
    setting_overrides,
    write_json,
)
from sample_efficiency import BASE, METHODS, QUICK

PHASES = ("rollout", "scoring", "advantages", "update", "predictor")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds, the first one dropped as warm-up.")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--rounds", type=int, default=12, help="Steps each method takes.")
    p.add_argument("--warmup", type=int, default=2, help="First rounds left out of the statistics.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "step_overhead.json")
    add_config_args(p)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.warmup = 3, 1
    if "grpo" not in args.methods or args.rounds <= args.warmup:
        p.error("--methods must include grpo and --rounds must exceed --warmup")
    return args


def phases_of(record: dict[str, Any]) -> dict[str, float]:
    """Phase seconds of one step with the scheme's scoring/planning moved out of ``rollout``."""
    moved_scoring = record["time_rollout_readiness"]
    moved_predict = record["time_rollout"] - record["time_rollout_execute"] - moved_scoring
    return {
        "rollout": record["time_rollout_execute"],
        "scoring": record["time_scoring"] + moved_scoring,
        "advantages": record["time_advantages"],
        "update": record["time_update"],
        "predictor": record["time_predictor"] + moved_predict,
    }


def measure(args: argparse.Namespace, overrides: list[str]) -> dict[str, list[dict[str, Any]]]:
    from tracerl.train.loop import Trainer

    trainers = {}
    for method in args.methods:
        config = resolve(method, overrides + [f"seed={args.seed}", f"steps={args.rounds}"], args.smoke)
        trainers[method] = Trainer(config, fresh_dir(args.work_dir / f"overhead-{method}"))
    steps: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    for rnd in range(args.rounds):
        shift = rnd % len(args.methods)
        for method in args.methods[shift:] + args.methods[:shift]:
            record = trainers[method].step()
            phases = phases_of(record)
            steps[method].append({"round": rnd, "step_seconds": record["step_seconds"], "phases": phases,
                                  "generated_tokens": record["generated_tokens"], "rollouts": record["rollouts"],
                                  "trajectories": record["trajectories"], "trained_tokens": record["trained_tokens"]})
        print(f"round {rnd}: " + "  ".join(f"{m}={steps[m][-1]['step_seconds']:.2f}s" for m in args.methods), flush=True)
    return steps


def _per_token(seconds: list[float], tokens: list[float]) -> float | None:
    """Milliseconds per token over the steps that trained any (rows with zero advantage are skipped)."""
    total = sum(t for t in tokens if t)
    return 1000 * sum(s for s, t in zip(seconds, tokens, strict=True) if t) / total if total else None


def summarise(steps: dict[str, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    kept = {m: s[warmup:] for m, s in steps.items()}
    methods = {}
    for name, rows in kept.items():
        tokens = sum(r["generated_tokens"] for r in rows)
        methods[name] = {
            "seconds": {p: median([r["phases"][p] for r in rows]) for p in PHASES},
            "step_seconds": median([r["step_seconds"] for r in rows]),
            "generated_tokens": mean([r["generated_tokens"] for r in rows]),
            "ms_per_generated_token": 1000 * sum(r["step_seconds"] for r in rows) / max(tokens, 1),
            "trained_tokens": mean([r["trained_tokens"] for r in rows]),
            "update_ms_per_trained_token": _per_token([r["phases"]["update"] for r in rows],
                                                      [r["trained_tokens"] for r in rows]),
            "over_grpo": median([r["step_seconds"] / g["step_seconds"] for r, g in zip(rows, kept["grpo"], strict=True)]),
        }
    out: dict[str, Any] = {"methods": methods, "phases": list(PHASES)}
    if "trace" in kept:
        trace, grpo = kept["trace"], kept["grpo"]
        per_step = [t["step_seconds"] / g["step_seconds"] for t, g in zip(trace, grpo, strict=True)]
        added = [(t["phases"]["scoring"] + t["phases"]["predictor"]) / g["step_seconds"] for t, g in zip(trace, grpo, strict=True)]
        out.update({
            "trace_over_grpo": median(per_step),
            "trace_over_grpo_per_step": per_step,
            "trace_over_grpo_per_token": methods["trace"]["ms_per_generated_token"] / methods["grpo"]["ms_per_generated_token"],
            "trace_added_phases_over_grpo": median(added),
        })
    else:
        out["trace_over_grpo"] = None
    return out


def plot(summary: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["methods"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    bottom = [0.0] * len(names)
    for phase in PHASES:
        values = [summary["methods"][n]["seconds"][phase] or 0.0 for n in names]
        axes[0].bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes[0].set(ylabel="seconds per step (median)", title="Step wall time by phase")
    axes[0].tick_params(axis="x", rotation=30)
    axes[0].legend(fontsize=8)
    if summary.get("trace_over_grpo_per_step"):
        ratios = summary["trace_over_grpo_per_step"]
        axes[1].plot(range(1, len(ratios) + 1), ratios, marker="o")
        axes[1].axhline(1.1, color="grey", ls=":", lw=1, label="goal: at most 1.10")
        axes[1].set(xlabel="measured round", ylabel="trace / grpo step time", title="TRACE over GRPO, same round")
        axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, out)


def main() -> None:
    args = _args()
    configure_torch(args.threads)
    overrides = setting_overrides(args, BASE + (QUICK if args.quick else []))
    clock = time.perf_counter()
    steps = measure(args, overrides)
    summary = summarise(steps, args.warmup)
    result = {
        **summary,
        "setting": {"overrides": overrides, "smoke": args.smoke, **describe_config(resolve("grpo", overrides, args.smoke)),
                    "rounds": args.rounds, "warmup_rounds": args.warmup, "seed": args.seed},
        "steps": steps,
        "quick": args.quick,
        "seconds": time.perf_counter() - clock,
        **machine(),
    }
    write_json(args.out, result)
    png = plot(summary, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    for name, m in summary["methods"].items():
        print(f"{name:>12}: step {m['step_seconds']:.3f}s  " + " ".join(f"{p}={m['seconds'][p]:.3f}" for p in PHASES)
              + f"  over_grpo {m['over_grpo']:.2f}")
    print(f"trace_over_grpo = {summary['trace_over_grpo']}")


if __name__ == "__main__":
    main()
