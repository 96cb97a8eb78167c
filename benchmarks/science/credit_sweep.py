"""TRACE credit sweeps: the window K, the turn weight w_turn and the value form (issue 13 item 3).

Trains the ``trace_credit`` preset (chain rollouts, TRACE turn credit) at several values of
``algo.advantage.horizon`` (K), ``algo.advantage.w_turn`` and ``algo.advantage.credit_value``,
everything else as in ``sample_efficiency.py`` (its budget, evaluation and setting, imported
from it and from ``common.py``), and reports held-out accuracy per point over seeds.

Grids: ``cross`` (default) varies one knob at a time around the spec's defaults (K = 3,
w_turn = 0.2, log_ratio): K in ``--horizons``, w_turn in ``--w-turns``, the forms in
``--forms``; ``full`` is the K x w_turn grid (log_ratio only). ``w_turn = 0`` is GRPO exactly
(chains, no turn term; the reference still scores, so its cost is trace_credit's).

Summary per point (``points`` in the JSON, keyed by label, e.g. ``K=3 w_turn=0.2 log_ratio``):
``final_accuracy_mean``/``_std`` (unseen world, over seeds), ``final_accuracy_by_hops`` (mean, std
and seeds per hop count), the mean of every other final split
``run_one`` reports (``<split>_accuracy_mean``), ``effective_ratio_mean``, ``reward_mean``,
``total_generated_tokens_mean``, ``late_tokens_per_step_mean`` (generated tokens per step between
the last two evaluations: longer episodes mean more searches), ``delta_vs_center`` (final accuracy minus the default point's) and
``delta_vs_center_paired`` (``_std``, ``_below``: seeds where the point is lower, ``paired_seeds``):
the same difference seed by seed over the seeds both points ran, the fair one when a partial
sweep left points with different seeds; ``delta_vs_grpo_paired`` likewise against ``w_turn = 0``.

    python benchmarks/science/credit_sweep.py --quick   # smoke world, smoke tiny model, 4 points x 1 seed x 3 steps: ~2 min
    python benchmarks/science/credit_sweep.py           # the testbed (--setting bench): 10 points x 3 seeds x 200 steps

The full sweep is 30 trace_credit runs of sample_efficiency's length (in the testbed at 100
steps 7-14 min of one core each, final evaluation included, more when a run collapses: some 4-7
hours). Run it in shards, one per core (set PYTHONPATH to the checkout so the scripts import its
tracerl):

    B=benchmarks/science/credit_sweep.py
    python $B --seed-list 0 1 --out /tmp/c01.json --work-dir /tmp/c01 &
    python $B --seed-list 2 --out /tmp/c2.json --work-dir /tmp/c2
    wait; python $B --merge /tmp/c01.json /tmp/c2.json   # -> benchmarks/results/credit_sweep.json

or as queues that share one job list (``--claim-dir``: each (point, seed) runs in whichever queue
claims it first), skipping what earlier shards already hold (``--skip-from``). A shard file is
rewritten after every run, so a queue that is killed keeps the runs it finished; shards of
different grids merge (the union of their points).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import (
    RESULTS,
    add_config_args,
    check_one_base_model,
    check_one_cpu_per_seed,
    configure_torch,
    describe_config,
    machine,
    mean,
    provenance_of,
    resolve,
    save_figure,
    std,
    write_json,
)
from sample_efficiency import SETTINGS, hops_summary, protocol_summary, run_one, sweep_overrides

from tracerl.core.credit import CENTRE_MODES

PRESET = "trace_credit"
CENTER = (3, 0.2, "log_ratio")
"""The spec's defaults (K = 3, w_turn = 0.2, log-ratio values): every axis of the cross grid passes through it."""
FORMS = ("log_ratio", "raw_diff", "remaining_gap")
GRPO_POINT = f"K={CENTER[0]} w_turn=0 {CENTER[2]}"
"""``w_turn = 0``: the turn term off, GRPO exactly (chains, outcome advantage only)."""


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="Smoke world and smoke tiny model (--smoke --dev-model), 4 points, 1 seed x 3 steps.")
    p.add_argument("--grid", choices=("cross", "full"), default="cross")
    p.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 3, 5], help="Window lengths K.")
    p.add_argument("--w-turns", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.5, 1.0], help="Turn weights.")
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS, help="Value forms (cross grid).")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-list", type=int, nargs="+", help="Run these seeds instead of 0..--seeds-1 (a shard).")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--final-eval", type=int, default=200, help="Questions per split in the final evaluation.")
    p.add_argument("--sampled-eval", type=int, default=300, help="As in sample_efficiency.py: the sampled endpoint.")
    p.add_argument("--samples", type=int, default=4, help="Samples per question of the sampled endpoint.")
    p.add_argument("--centres", nargs="+", default=["none"], choices=CENTRE_MODES,
                   help="Turn-term centring (algo.advantage.credit_centre); each mode other than none adds two "
                        "points, at the centre and at K = 1 (cross grid).")
    p.add_argument("--merge", type=Path, nargs="+", metavar="SHARD.json", help="Combine shard files; trains nothing.")
    p.add_argument("--skip-from", type=Path, nargs="+", default=[], metavar="SHARD.json",
                   help="Do not rerun the (point, seed) runs these files hold (shards, or a sample-efficiency "
                        "result: its trace_credit and grpo runs are the centre and w_turn = 0).")
    p.add_argument("--import-from", type=Path, nargs="+", default=[], metavar="SWEEP.json",
                   help="With --merge: sample-efficiency results (same setting) whose trace_credit and grpo runs "
                        "join as the centre and the w_turn = 0 point.")
    p.add_argument("--claim-dir", type=Path, metavar="DIR",
                   help="Queues given the same folder split the jobs: a job runs in the queue that claims it first.")
    p.add_argument("--setting", choices=sorted(SETTINGS), default="bench",
                   help="As in sample_efficiency.py: bench (common.BENCH_SETTING, the default) or demo.")
    p.add_argument("--out", type=Path, default=RESULTS / "credit_sweep.json")
    add_config_args(p)
    args = p.parse_args()
    if args.quick:
        args.smoke, args.dev_model = True, True
        args.seeds, args.steps, args.final_eval, args.sampled_eval, args.samples = 1, 3, 16, 16, 2
        args.horizons, args.w_turns, args.forms = [1, 3], [0.2, 1.0], ["log_ratio", "remaining_gap"]
    args.seed_list = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    return args


def label(horizon: int, w_turn: float, form: str, centre: str = "none") -> str:
    return f"K={horizon} w_turn={w_turn:g} {form}" + ("" if centre == "none" else f" centre={centre}")


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The sweep's points, the centre first; each names the axes it lies on."""
    k0, w0, f0 = CENTER
    if args.grid == "full":
        combos = [(k, w, f0) for k in args.horizons for w in args.w_turns]
    else:
        combos = [CENTER] + [(k, w0, f0) for k in args.horizons] + [(k0, w, f0) for w in args.w_turns]
        combos += [(k0, w0, f) for f in args.forms]
    points: dict[str, dict[str, Any]] = {}
    for k, w, f in combos:
        axes = [name for name, same in (("horizon", (w, f) == (w0, f0)), ("w_turn", (k, f) == (k0, f0)),
                                        ("credit_value", (k, w) == (k0, w0))) if same]
        points.setdefault(label(k, w, f), {"horizon": k, "w_turn": w, "credit_value": f, "axes": axes})
    for c in (c for c in getattr(args, "centres", ["none"]) if c != "none"):  # centred: at the centre and at K = 1
        for k in dict.fromkeys((k0, 1)):
            points.setdefault(label(k, w0, f0, c), {"horizon": k, "w_turn": w0, "credit_value": f0,
                                                    "credit_centre": c, "axes": ["credit_centre"]})
    return [{"label": name, **point} for name, point in points.items()]


def point_overrides(point: dict[str, Any]) -> list[str]:
    centre = point.get("credit_centre", "none")  # shards written before the centring axis hold none
    return [f"algo.advantage.horizon={point['horizon']}", f"algo.advantage.w_turn={point['w_turn']}",
            f"algo.advantage.credit_value={point['credit_value']}"] + (
        [f"algo.advantage.credit_centre={centre}"] if centre != "none" else [])


def late_tokens_per_step(run: dict[str, Any]) -> float | None:
    """Generated tokens per step between the last two evaluations: how long episodes got by the end."""
    if len(run["curve"]) < 2:
        return None
    a, b = run["curve"][-2], run["curve"][-1]
    return (b["generated_tokens"] - a["generated_tokens"]) / (b["step"] - a["step"]) if b["step"] > a["step"] else None


def summarise(points: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for point in points:
        rs = runs.get(point["label"], [])
        if not rs:
            continue
        finals = [r["final"]["unseen"] for r in rs]
        summary = {**{k: point[k] for k in ("horizon", "w_turn", "credit_value", "axes")},
                   "final_accuracy_mean": mean(finals), "final_accuracy_std": std(finals),
                   "final_accuracy_by_hops": hops_summary(rs)}
        for split in rs[0]["final"]:  # whatever splits run_one reports: numbers, or dicts (per hop count)
            values = [r["final"].get(split) for r in rs]
            if split == "unseen":
                continue
            if all(isinstance(v, dict) for v in values):
                summary[f"{split}_mean"] = {k: mean([v.get(k) for v in values]) for k in values[0]}
            elif all(isinstance(v, (int, float, type(None))) for v in values):
                summary[f"{split}_accuracy_mean"] = mean(values)
        summary.update({
            "effective_ratio_mean": mean([e for r in rs for e in r["effective_ratio"]]),
            "reward_mean": mean([x for r in rs for x in r["reward_mean"]]),
            "total_generated_tokens_mean": mean([r["curve"][-1]["generated_tokens"] for r in rs]),
            "late_tokens_per_step_mean": mean([late_tokens_per_step(r) for r in rs]),
            "seeds": len(rs), "seed_list": [r["seed"] for r in rs],
            "credit_centre": point.get("credit_centre", "none"),
            **protocol_summary(rs, runs.get(GRPO_POINT)),
        })
        out[point["label"]] = summary
    center = out.get(label(*CENTER), {}).get("final_accuracy_mean")
    for name, summary in out.items():
        acc = summary["final_accuracy_mean"]
        summary["delta_vs_center"] = acc - center if acc is not None and center is not None else None
        # over the seeds both points ran (the seed is shared: same initial model, same evaluation questions)
        for key, ref in (("center", label(*CENTER)), ("grpo", GRPO_POINT)):
            by_seed = {r["seed"]: r["final"]["unseen"] for r in runs.get(ref, [])}
            paired = [r["final"]["unseen"] - by_seed[r["seed"]] for r in runs[name] if r["seed"] in by_seed]
            summary[f"delta_vs_{key}_paired"] = mean(paired)
            summary[f"delta_vs_{key}_paired_std"] = std(paired)
            summary[f"delta_vs_{key}_paired_below"] = sum(d < 0 for d in paired)  # seeds where the point is worse
            summary["paired_seeds" if key == "center" else "paired_seeds_grpo"] = len(paired)
    return out


def plot(points: dict[str, Any], out: Path, runs: dict[str, list[dict[str, Any]]] | None = None) -> Path:
    """Mean final accuracy along each axis, with every seed's run as a dot (seed sets differ by point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, axis, title in zip(axes, ("horizon", "w_turn", "credit_value"),
                               ("window K (w_turn 0.2)", "w_turn (K = 3)", "value form (K = 3, w_turn 0.2)"), strict=True):
        on = [(name, p[axis], p) for name, p in points.items() if axis in p["axes"]]
        if axis != "credit_value":
            on.sort(key=lambda item: item[1])
        xs = [str(x) for _, x, _ in on]
        ax.plot(xs, [p["final_accuracy_mean"] or 0.0 for _, _, p in on], marker="o", label="mean over seeds")
        for i, (name, _, p) in enumerate(on):
            finals = [r["final"]["unseen"] for r in (runs or {}).get(name, [])]
            ax.scatter([i] * len(finals), finals, s=12, color="grey", alpha=0.7, zorder=3,
                       label="one seed" if i == 0 and finals else None)
            ax.annotate(f"n={p['seeds']}", (i, p["final_accuracy_mean"] or 0.0), textcoords="offset points",
                        xytext=(6, 4), fontsize=7)
        ax.set(title=title, ylabel="final accuracy (unseen world)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, out)


IMPORTED = {"trace_credit": label(*CENTER), "grpo": GRPO_POINT}
"""A sample-efficiency sweep's presets that are points of this grid: ``trace_credit`` is the centre
(its defaults), and ``grpo`` is ``w_turn = 0`` (chains, outcome advantage only: the same run,
bit for bit, as checked on seed 1)."""
SAME_KNOBS = ("overrides", "smoke", "hard", "tiny_preset", "world", "train_worlds", "search_top_k", "engine",
              "budget", "pool_size", "group_size", "lr", "eval_every", "eval_size", "steps", "final_eval_questions")
"""The setting keys a sample-efficiency sweep must share with a credit sweep to lend it runs."""


def shard_runs(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """A file's setting and runs by point label: a credit-sweep shard as it is, or a sample-efficiency
    result (it has ``methods``) through :data:`IMPORTED`."""
    data = json.loads(path.read_text())
    if "methods" not in data:
        return data, data["runs"]
    return data, {IMPORTED[preset]: rs for preset, rs in data["runs"].items() if preset in IMPORTED}


def merge_shards(paths: list[Path], imports: list[Path] = ()) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Runs and metadata of several shards; their settings must agree, their grids are united.

    ``imports`` are sample-efficiency results whose :data:`IMPORTED` presets join as points; their
    setting must match on :data:`SAME_KNOBS`. A run that two files hold must be identical in both."""
    shards = [json.loads(p.read_text()) for p in paths]
    def same(shard: dict[str, Any]) -> Any:
        return {k: v for k, v in shard["setting"].items() if k not in ("seeds", "seed_list", "imported")}

    for path, shard in zip(paths[1:], shards[1:], strict=True):
        if same(shard) != same(shards[0]):
            raise SystemExit(f"{path}: its setting differs from {paths[0]}'s")
    check_one_base_model(paths, shards)
    check_one_cpu_per_seed(paths, shards)
    sources: list[tuple[Path, dict[str, Any], dict[str, list[dict[str, Any]]]]] = [
        (p, shard["grid"], shard["runs"]) for p, shard in zip(paths, shards, strict=True)]
    grid_of = {p["label"]: p for p in grid(argparse.Namespace(grid="cross", horizons=[CENTER[0]],
                                                              w_turns=[0.0, CENTER[1]], forms=[CENTER[2]]))}
    for path in imports:
        theirs, runs_by_label = shard_runs(path)
        ours = shards[0]["setting"]
        differ = [k for k in SAME_KNOBS if theirs["setting"].get(k) != ours.get(k)]
        if differ:
            raise SystemExit(f"{path}: its setting differs from {paths[0]}'s in {', '.join(differ)}")
        sources.append((path, [grid_of[name] for name in runs_by_label], runs_by_label))
    grid_points: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for path, points, shard_run in sources:
        for point in points:
            grid_points.setdefault(point["label"], point)
        for name, rs in shard_run.items():
            for run in rs:
                twin = next((r for r in runs.get(name, []) if r["seed"] == run["seed"]), None)
                if twin is None:
                    runs.setdefault(name, []).append(run)
                elif (twin["final"], twin["curve"]) != (run["final"], run["curve"]):  # runs are deterministic
                    raise SystemExit(f"{path}: {name} seed {run['seed']} is in two shards with different results")
    runs = {name: sorted(rs, key=lambda r: r["seed"]) for name, rs in runs.items() if rs}
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    imported = {path.name: dict(IMPORTED) for path in imports}
    setting = {**shards[0]["setting"], "seeds": len(seeds), "seed_list": seeds}
    if imported:
        setting["imported"] = imported
    return runs, {**shards[0], "grid": list(grid_points.values()), "setting": setting,
                  "seconds": sum(s["seconds"] for s in shards), "shards": [p.name for p in paths]}


def done_runs(paths: list[Path]) -> set[tuple[str, int]]:
    """The (point label, seed) pairs that the files ``paths`` (shards or a sample-efficiency result) hold."""
    return {(name, run["seed"]) for path in paths for name, rs in shard_runs(path)[1].items() for run in rs}


def slug(name: str) -> str:
    """A point label as a folder name (work folders and claim markers): ``K=3 w_turn=0.2 x`` -> ``K3_w_turn0.2_x``."""
    return name.replace(" ", "_").replace("=", "")


def claim(claim_dir: Path | None, name: str, seed: int) -> bool:
    """True when this queue may run the job: no claim folder, or it created the job's marker first."""
    if claim_dir is None:
        return True
    claim_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(claim_dir / f"{slug(name)}-seed{seed}")
    except FileExistsError:
        return False
    return True


def sweep(args: argparse.Namespace, points: list[dict[str, Any]],
          save: Any = None) -> tuple[dict[str, list[dict[str, Any]]], dict]:
    """Train every (point, seed) not skipped or claimed elsewhere; ``save(runs, setting)`` after each run."""
    configure_torch(args.threads)
    overrides = sweep_overrides(args)
    setting = {"preset": PRESET, "overrides": overrides, "setting": args.setting, "smoke": args.smoke, "hard": args.hard,
               **describe_config(resolve(PRESET, overrides, args.smoke)), "steps": args.steps,
               "seeds": len(args.seed_list), "final_eval_questions": args.final_eval, "grid_kind": args.grid,
               "sampled_questions": args.sampled_eval, "sampled_samples": args.samples,
               "held_out": "test split of an unseen world (data.eval_fact_seed)"}
    skip = done_runs(args.skip_from)
    runs: dict[str, list[dict[str, Any]]] = {p["label"]: [] for p in points}
    base: dict[int, float] = {}  # the initial model's accuracy per seed (shared by every point)
    for seed in args.seed_list:  # seed-major: a partial sweep still covers every point
        for point in points:
            if (point["label"], seed) in skip or not claim(args.claim_dir, point["label"], seed):
                continue
            folder = args.work_dir / slug(point["label"])
            local = argparse.Namespace(**{**vars(args), "work_dir": folder})
            print(f"-- {point['label']} seed {seed}", flush=True)
            runs[point["label"]].append(run_one(PRESET, seed, overrides + point_overrides(point), local, base))
            if save is not None:
                save(runs, setting)
    return runs, setting


def result_of(points: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], setting: dict[str, Any],
              quick: bool, seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {"points": summarise(points, runs), "center": label(*CENTER), "grpo_point": GRPO_POINT, "grid": points,
            "setting": setting, "runs": runs, "quick": quick, "seconds": seconds, **extra}


def main() -> None:
    args = _args()
    clock = time.perf_counter()
    if args.merge:
        runs, shard = merge_shards(args.merge, args.import_from)
        points, setting, quick, seconds = shard["grid"], shard["setting"], shard["quick"], shard["seconds"]
        extra = {"shards": shard["shards"], "provenance": shard.get("provenance"),
                 **{k: shard[k] for k in ("machine", "python", "torch", "threads", "cpus")}}
    else:
        points, quick = grid(args), args.quick
        extra = {**machine(), "provenance": provenance_of(resolve(PRESET, sweep_overrides(args), args.smoke))}

        def save(runs: dict[str, list[dict[str, Any]]], setting: dict[str, Any]) -> None:  # a killed queue keeps these
            write_json(args.out, result_of(points, runs, setting, quick, time.perf_counter() - clock, extra))

        runs, setting = sweep(args, points, save)
        seconds = time.perf_counter() - clock
    result = result_of(points, runs, setting, quick, seconds, extra)
    summary = result["points"]
    write_json(args.out, result)
    png = plot(summary, args.out.with_suffix(".png"), runs)
    print(f"wrote {args.out} and {png} ({seconds:.0f} s)")
    def num(x: float | None, fmt: str = ".3f") -> str:
        return "-" if x is None else format(x, fmt)

    for name, s in summary.items():
        print(f"{name:>28}: final {num(s['final_accuracy_mean'])} +- {num(s['final_accuracy_std'])}  "
              f"eff {num(s['effective_ratio_mean'])}  reward {num(s['reward_mean'])}  "
              f"delta vs centre {num(s['delta_vs_center_paired'], '+.3f')} (paired, {s['paired_seeds']} seeds)")


if __name__ == "__main__":
    main()
