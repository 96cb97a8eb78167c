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

Tree packing (``optim.tree_packing``): a method written ``preset@on`` or ``preset@off`` runs the
preset with packing forced on or off; the default list runs each of grpo, trace, trace_credit
and tree_grpo both ways in the same rounds. ``packing`` then gives, per preset, the tokens the
update forwarded and trained (``update_forward_tokens``, ``trained_tokens``,
``unique_trained_tokens``: a token the leaves of a tree share counts once) and the update's
seconds with packing on and off, with the median over rounds of their per-round ratio.

    python benchmarks/systems/step_overhead.py --quick   # 8 runs x 3 rounds (first dropped): ~2 min on 2 cores
    python benchmarks/systems/step_overhead.py           # 8 runs x 12 rounds (first 2 dropped): ~10 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "science"))  # sample_efficiency.py's settings
from common import (
    RESULTS,
    add_config_args,
    configure_torch,
    describe_config,
    fresh_dir,
    machine,
    mean,
    median,
    provenance_of,
    resolve,
    save_figure,
    setting_overrides,
    write_json,
)
from sample_efficiency import BASE, METHODS, QUICK

PHASES = ("rollout", "scoring", "advantages", "update", "predictor")
DEFAULT_RUNS = ("grpo", "grpo@on", "trace", "trace@off", "trace_credit", "trace_credit@on", "tree_grpo",
                "tree_grpo@off")
"""Each preset with its default packing (``auto``: on for branching schemes) and the other way."""


def split_method(name: str) -> tuple[str, list[str]]:
    """``preset@on`` -> (``preset``, [``optim.tree_packing=on``]); a plain preset takes its default."""
    preset, _, packing = name.partition("@")
    if packing and packing not in ("on", "off"):
        raise SystemExit(f"method {name!r}: the part after @ must be 'on' or 'off' (optim.tree_packing)")
    return preset, [f"optim.tree_packing={'always' if packing == 'on' else 'never'}"] if packing else []


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds, the first one dropped as warm-up.")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_RUNS),
                   help=f"Presets ({', '.join(METHODS)}), each optionally @on or @off (optim.tree_packing).")
    p.add_argument("--rounds", type=int, default=12, help="Steps each method takes.")
    p.add_argument("--warmup", type=int, default=2, help="First rounds left out of the statistics.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "step_overhead.json")
    add_config_args(p)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.warmup = 3, 1
    for name in args.methods:
        if split_method(name)[0] not in METHODS:
            p.error(f"--methods: unknown preset in {name!r}; choose from {', '.join(METHODS)}")
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
        preset, packing = split_method(method)
        config = resolve(preset, overrides + packing + [f"seed={args.seed}", f"steps={args.rounds}"], args.smoke)
        trainers[method] = Trainer(config, fresh_dir(args.work_dir / f"overhead-{method.replace('@', '-')}"))
    steps: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    for rnd in range(args.rounds):
        shift = rnd % len(args.methods)
        for method in args.methods[shift:] + args.methods[:shift]:
            record = trainers[method].step()
            phases = phases_of(record)
            steps[method].append({"round": rnd, "step_seconds": record["step_seconds"], "phases": phases,
                                  "generated_tokens": record["generated_tokens"], "rollouts": record["rollouts"],
                                  "trajectories": record["trajectories"], "trained_tokens": record["trained_tokens"],
                                  "unique_trained_tokens": record.get("unique_trained_tokens", 0.0),
                                  "update_forward_tokens": record.get("update_forward_tokens", 0.0),
                                  "tree_packing": trainers[method].update_settings.tree_packing})
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
            "unique_trained_tokens": mean([r["unique_trained_tokens"] for r in rows]),
            "update_forward_tokens": mean([r["update_forward_tokens"] for r in rows]),
            "tree_packing": rows[0]["tree_packing"],
            "update_ms_per_trained_token": _per_token([r["phases"]["update"] for r in rows],
                                                      [r["trained_tokens"] for r in rows]),
            "over_grpo": median([r["step_seconds"] / g["step_seconds"] for r, g in zip(rows, kept["grpo"], strict=True)]),
        }
    out: dict[str, Any] = {"methods": methods, "phases": list(PHASES), "packing": packing_pairs(kept, methods)}
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


def packing_pairs(kept: dict[str, list[dict[str, Any]]], methods: dict[str, Any]) -> dict[str, Any]:
    """Per preset run both ways: tokens and update seconds with packing on and off, and the median
    over rounds of the update's off/on time ratio (the same round's steps, so load hits both)."""
    out = {}
    for name in kept:
        preset, _ = split_method(name)
        runs = {methods[m]["tree_packing"] != "never": m for m in kept if split_method(m)[0] == preset}
        if set(runs) != {True, False} or preset in out:
            continue
        on, off = kept[runs[True]], kept[runs[False]]
        ratios = [b["phases"]["update"] / a["phases"]["update"] for a, b in zip(on, off, strict=True)
                  if a["phases"]["update"] > 0]
        out[preset] = {
            "runs": {"on": runs[True], "off": runs[False]},
            "update_seconds": {"on": methods[runs[True]]["seconds"]["update"],
                               "off": methods[runs[False]]["seconds"]["update"]},
            "update_off_over_on": median(ratios) if ratios else None,
            "update_forward_tokens": {"on": methods[runs[True]]["update_forward_tokens"],
                                      "off": methods[runs[False]]["update_forward_tokens"]},
            "trained_tokens": {"on": methods[runs[True]]["trained_tokens"], "off": methods[runs[False]]["trained_tokens"]},
            "unique_trained_tokens": methods[runs[True]]["unique_trained_tokens"],
            "step_over_grpo": {"on": methods[runs[True]]["over_grpo"], "off": methods[runs[False]]["over_grpo"]},
        }
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
        axes[1].axhline(1.3, color="grey", ls=":", lw=1, label="goal: at most 1.3")
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
        "provenance": provenance_of(resolve("grpo", overrides, args.smoke)),
    }
    write_json(args.out, result)
    png = plot(summary, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    for name, m in summary["methods"].items():
        print(f"{name:>12}: step {m['step_seconds']:.3f}s  " + " ".join(f"{p}={m['seconds'][p]:.3f}" for p in PHASES)
              + f"  over_grpo {m['over_grpo']:.2f}")
    print(f"trace_over_grpo = {summary['trace_over_grpo']}")
    for preset, pair in summary["packing"].items():
        print(f"{preset:>12}: update off/on {pair['update_off_over_on']}  forward tokens "
              f"{pair['update_forward_tokens']['off']:.0f} -> {pair['update_forward_tokens']['on']:.0f}  "
              f"trained {pair['trained_tokens']['on']:.0f} (unique {pair['unique_trained_tokens']:.0f})")


if __name__ == "__main__":
    main()
