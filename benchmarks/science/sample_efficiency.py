"""Sample efficiency: held-out accuracy per generated token and per rollout, every method preset.

Issue 7 item 1. Every preset (grpo, dapo, gigpo, tree_grpo, trace_alloc, trace_credit, trace)
trains the same initial model with the same per-step budget of continuation rollouts
(``rollout.budget``), for the same number of steps, over ``--seeds`` seeds. Held-out accuracy is
measured every ``eval.every`` steps on questions of an *unseen world* (same names, facts drawn
from a fact seed no training world used), so it measures reading observations, not recalling
facts. At the end each run is also evaluated on training-split questions of a seen training world
and of a world whose facts were re-drawn (memorisation check): what generalises shows as a small
gap between the seen-world and the unseen-world accuracy.

Setting (recorded in the JSON): by default (``--setting bench``) issue 13's testbed,
:data:`common.BENCH_SETTING`: 1-3 hop questions on a world without look-alike distractor names,
three search results per call, at most 6 turns of at most 32 tokens, the ``bench_hops`` tiny model
(pretrained with a hop-aware explorer; its base success is a few percent on two-hop questions and
GRPO learns two and three hops), lr 1e-3, evaluation every 20 steps. ``--setting demo`` is the sweep before issue 13: the demo's
setting (:data:`common.LEARNABLE_SETTING`, 1-2 hops, two results per call, the default world's
look-alike names) at the library's learning rate 3e-4 (:data:`SLOWER`); ``--hard`` adds
:data:`common.HARD_SETTING`; ``--set a.b=value`` changes anything.

Summary per method (``methods`` in the JSON; stable keys): ``final_accuracy_mean``/``_std``
(unseen world, over seeds), ``final_accuracy_by_hops`` (``{"1": {"mean", "std", "seeds"}, "2": ...}``,
unseen world, per hop count), ``effective_ratio_mean`` (over steps and seeds),
``tokens_to_grpo_final`` (cumulative generated tokens at the first evaluation where the seed-mean
accuracy reaches GRPO's final seed-mean accuracy; null when never reached) plus
``rollouts_to_grpo_final``, ``tokens_fraction_of_grpo`` (that over GRPO's total tokens),
``train_accuracy_mean`` and ``redrawn_accuracy_mean``, and ``tokens_to_90pct_grpo_final`` (the same
at 90% of GRPO's final accuracy: when every method ends on the same plateau, the first evaluation
at or above GRPO's final mean is decided by evaluation noise, and 90% of it is not). ``grpo_improved`` says whether GRPO beat the
initial model at all; when it did not, GRPO's final accuracy is reached at step 0 and every
``tokens_to_grpo_final`` is 0, which then says nothing about sample efficiency.

    python benchmarks/science/sample_efficiency.py --quick   # 7 presets x 1 seed x 4 steps: ~2 min on 2 cores
    python benchmarks/science/sample_efficiency.py --steps 100 --seed-list 0   # one seed of the 8 presets: ~20 min of one core

Shards: ``--methods``/``--seed-list`` with ``--out`` run part of the sweep (one process per core),
``--merge A.json B.json`` summarises the shards into ``--out``, after checking every shard whole
(benchmarks/shards.py: schema, finite numbers, unique seeds, one base model) before anything is written.

Development while the embedded model is being tuned: ``--smoke --dev-model`` (smoke world, the
smoke tiny model) or ``--set model.name_or_path=FOLDER``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import (
    BENCH_SETTING,
    CREDIT_SETTING,
    LOOKALIKE_SETTING,
    LEARNABLE_SETTING,
    LONG_SETTING,
    RESULTS,
    add_config_args,
    check_one_base_model,
    check_one_cpu_per_seed,
    configure_torch,
    describe_config,
    fresh_dir,
    machine,
    mean,
    provenance_of,
    questions_per_hop,
    recorded,
    resolve,
    save_figure,
    setting_overrides,
    std,
    write_json,
)
from shards import ShardError, check_aligned, check_shard, read_shard
from protocol import COLLAPSE_RULE, add_holm, collapsed, escape_summary, factorial_2x2, paired_deltas, paired_stats

METHODS = ("grpo", "dapo", "gigpo", "gspo", "tree_grpo", "trace_alloc", "trace_credit", "trace")
"""The method presets a sweep runs by default (issue 13: all of them, the same budget)."""
ABLATIONS = ("trace_alloc_uu", "trace_alloc_ul", "trace_alloc_lu")
"""The allocation 2x2's other arms (roots then prefixes, uniform or learned; ``trace_alloc`` is l+l):
``--methods`` takes them, the default sweep does not run them."""
OPTIONS = ("trace_alloc_floor", "trace_alloc_coverage", "trace_alloc_explore", "trace_alloc_rootstage1",
           "trace_credit_k1", "trace_credit_gated", "trace_credit_gated_k1", "trace_credit_gated_turn",
           "trace_credit_clip", "trace_credit_once")
"""The options beside the papers' forms (docs/TRACE.md sections 2-3, departures): ``--methods`` takes them."""
MECHANISMS = ("trace_alloc_notree", "grpo_4x16", "grpo_twohop")
"""Arms that take TRACE allocation apart (tracerl/config/presets.py: the 2x2 tree x learned roots,
TRACE's group shape, two-hop prompts only): ``--methods`` takes them."""
BASE = ["rollout.budget=64", "rollout.pool_size=16", "rollout.schemes.group_size=8", "eval.every=10",
        "eval.size=100", "log.checkpoint_every=1000000", "log.rollouts=false"]
SLOWER = ("optim.lr=3e-4",)
"""After the demo's setting: the library's default learning rate instead of the demo's 1e-3, so that
GRPO needs about 50 steps to find the one-hop strategy and creeps up for 150 more (at 1e-3 every
method reached its plateau within 20-40 steps, on a base model drawn before the shipped one:
``results/earlier_draws/sample_efficiency_lr1e-3.json``)."""
SETTINGS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "bench": (BENCH_SETTING, ("eval.every=20",)),
    "demo": (LEARNABLE_SETTING, SLOWER),
    "credit": (CREDIT_SETTING, ("eval.every=20",)),
    "lookalike": (LOOKALIKE_SETTING, ("eval.every=20",)),
    "long": (LONG_SETTING, ("eval.every=20", "optim.lr=3e-4")),  # at 1e-3 the credit arms collapsed in pilot steps
}
"""``--setting``: the named setting and the tail applied after it."""
QUICK = ["rollout.budget=16", "rollout.pool_size=8", "rollout.schemes.group_size=4", "rollout.schemes.tree_initial=2",
         "rollout.schemes.tree_expand_nodes=1", "eval.every=2", "eval.size=32"]


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed x 4 steps, budget 16, 32 eval questions.")
    p.add_argument("--methods", nargs="+", choices=METHODS + ABLATIONS + OPTIONS + MECHANISMS,
                   help="Presets to run (default: METHODS); with --merge, keep only these arms of the shards.")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--seed-list", type=int, nargs="+", help="Run these seeds instead of 0..--seeds-1 (a shard).")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--merge", type=Path, nargs="+", metavar="SHARD.json",
                   help="Summarise the runs of these shard files (same setting) into --out; trains nothing.")
    p.add_argument("--other-cpu", type=Path, nargs="+", default=[], metavar="SHARD.json",
                   help="With --merge: shards that re-ran counted arms and seeds on another CPU type; reported "
                        "beside the merge as a same-seed comparison of machines, never merged.")
    p.add_argument("--final-eval", type=int, default=200, help="Questions per split in the final evaluation.")
    p.add_argument("--sampled-eval", type=int, default=300,
                   help="Unseen-world questions of the sampled endpoint (before training and at the end; 0: off).")
    p.add_argument("--samples", type=int, default=4, help="Samples per question of the sampled endpoint.")
    p.add_argument("--setting", choices=sorted(SETTINGS), default="bench",
                   help="bench: common.BENCH_SETTING (issue 13's testbed); demo: the demo's setting at lr 3e-4 "
                        "(the sweep of sample_efficiency.json before issue 13); credit: common.CREDIT_SETTING "
                        "(2-3 hops, 8 turns); lookalike: common.LOOKALIKE_SETTING (credit with look-alike names); "
                        "long: common.LONG_SETTING (4-5 hops on the clue world, lr 3e-4).")
    p.add_argument("--out", type=Path, default=RESULTS / "sample_efficiency.json")
    add_config_args(p)
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.final_eval, args.sampled_eval, args.samples = 1, 4, 32, 16, 2
    args.seed_list = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    args.merge_methods, args.methods = args.methods, args.methods or list(METHODS)
    if args.other_cpu and not args.merge:
        p.error("--other-cpu compares shards with the runs of --merge; give --merge too")
    return args


def sweep_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides of a sweep run: :data:`BASE` (with ``--quick``, :data:`QUICK`), the
    ``--setting`` and its tail, then ``--smoke``/``--dev-model``/``--set`` (credit_sweep.py too)."""
    named, tail = SETTINGS[args.setting]
    return setting_overrides(args, BASE + (QUICK if args.quick else []), tail=tail, setting=named)


def preset_overrides(preset: str, overrides: list[str]) -> list[str]:
    """``overrides`` less the sweep's own knobs (:data:`BASE`, :data:`QUICK`) that ``preset`` sets
    itself: ``grpo_4x16``'s group size is what the arm changes (every other preset sets none of them)."""
    from tracerl.config.presets import PRESETS

    def dotted(tree: dict[str, Any], prefix: str = "") -> set[str]:
        return set().union(*(dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
                             for k, v in tree.items()))

    own = dotted(PRESETS[preset])
    return [o for o in overrides if not (o in BASE + QUICK and o.split("=", 1)[0] in own)]


def run_one(preset: str, seed: int, overrides: list[str], args: argparse.Namespace,
            base: dict[int, dict[str, float]]) -> dict[str, Any]:
    """Train one preset for one seed; returns its curve and final accuracies."""
    from tracerl.train.loop import Trainer

    config = resolve(preset, preset_overrides(preset, overrides) + [f"seed={seed}", f"steps={args.steps}"], args.smoke)
    trainer = Trainer(config, fresh_dir(args.work_dir / f"{preset}-seed{seed}"))
    if seed not in base:  # same initial model, same eval sample at step 0 for every preset of a seed
        base[seed] = trainer.evaluate(trainer.data.held_out)
        base[seed]["sampled"] = sampled_success(trainer, seed, args)
    clock = time.perf_counter()
    records = trainer.run()
    seconds = time.perf_counter() - clock
    size, final = config.eval.size, min(args.final_eval, len(trainer.data.held_out))
    trainer.config.eval.size = final
    splits = {"unseen": trainer.data.held_out, "train": trainer.data.train, "redrawn": trainer.data.redrawn}
    metrics = {name: trainer.evaluate(tasks, name) for name, tasks in splits.items() if tasks}
    finals = {name: metrics[name][f"{name}_accuracy"] if name in metrics else None for name in splits}
    finals_by_hops = {name: by_hops(m, f"{name}_accuracy_hops") for name, m in metrics.items()}
    trainer.config.eval.size = size
    sampled = sampled_success(trainer, seed, args)
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": base[seed]["eval_accuracy"],
              "accuracy_by_hops": by_hops(base[seed], "eval_accuracy_hops")}]
    curve += [{"step": r["step"], "rollouts": r["total_rollouts"], "generated_tokens": r["total_generated_tokens"],
               "accuracy": r["eval_accuracy"], "accuracy_by_hops": by_hops(r, "eval_accuracy_hops")}
              for r in records if r.get("eval_accuracy") is not None]
    # the final point uses the larger final evaluation
    curve[-1].update(accuracy=finals["unseen"], accuracy_by_hops=finals_by_hops["unseen"])
    hops = " ".join(f"{h}-hop {v:.2f}" for h, v in finals_by_hops.get("unseen", {}).items())
    print(f"{preset:>12} seed {seed}: unseen {finals['unseen']:.3f} ({hops}) train {finals['train']:.3f} "
          f"eff {mean([r['effective_ratio'] for r in records]):.3f} tokens {records[-1]['total_generated_tokens']} "
          f"({seconds:.0f} s)", flush=True)
    return {
        "seed": seed, "curve": curve, "final": finals, "final_by_hops": finals_by_hops, "train_seconds": seconds,
        "effective_ratio": [r["effective_ratio"] for r in records],
        "reward_mean": [r["reward_mean"] for r in records],
        "step_seconds": [r["step_seconds"] for r in records],
        "sampled": sampled, "sampled_base": base[seed]["sampled"],
        "hop_share": {k[len("stratum_share_hops"):]: mean([r.get(k) for r in records])
                      for k in sorted({k for r in records for k in r if k.startswith("stratum_share_hops")})},
    }


def sampled_success(trainer: Any, seed: int, args: argparse.Namespace) -> dict[str, float] | None:
    """Success over ``--samples`` episodes per question at the rollout temperature, on the first
    ``--sampled-eval`` unseen-world questions, overall (``all``) and per hop count; the generator
    seed depends on the run seed only, so every arm of a seed draws from the same stream."""
    import torch

    from tracerl.rollout.evaluate import evaluate

    tasks = trainer.data.held_out[: args.sampled_eval]
    if not tasks or args.sampled_eval <= 0:
        return None
    trainer.model.eval()
    generator = torch.Generator().manual_seed(104729 + seed)
    executor = trainer.executor  # the local executor: its training engine samples at the rollout temperature
    with trainer._compute():
        report = evaluate(executor.engine, tasks, samples=args.samples, generator=generator)
    executor.clear_prefix_cache()  # as the executor's own evaluation: its KV must not serve training,
    take = getattr(executor.engine.env, "take_tool_stats", None)  # nor its tool calls count in a step
    if callable(take):
        take()
    return {"all": report.metrics["em"], **by_hops(report.metrics, "em_hops")}


def by_hops(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """``{"1": acc, "2": acc, ...}`` from the metric keys ``{prefix}{k}`` (hop counts as JSON keys)."""
    return {key[len(prefix):]: value for key, value in metrics.items() if key.startswith(prefix)}


def hops_summary(runs: list[dict[str, Any]], split: str = "unseen") -> dict[str, dict[str, float | None]]:
    """Final accuracy per hop count over seeds: ``{"1": {"mean", "std", "seeds"}, ...}``.

    Runs of shards written before per-hop evaluation have no ``final_by_hops`` and are skipped."""
    per_hop: dict[str, list[float]] = {}
    for run in runs:
        for hops, value in run.get("final_by_hops", {}).get(split, {}).items():
            per_hop.setdefault(hops, []).append(value)
    return {h: {"mean": mean(v), "std": std(v), "seeds": len(v)} for h, v in sorted(per_hop.items(), key=lambda x: int(x[0]))}


def mean_curve(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Seed-mean accuracy, rollouts and tokens at each evaluation step (all runs evaluate alike)."""
    steps = [p["step"] for p in runs[0]["curve"]]
    out = []
    for i, step in enumerate(steps):
        points = [run["curve"][i] for run in runs if i < len(run["curve"])]
        hops = sorted({h for p in points for h in p.get("accuracy_by_hops", {})}, key=int)
        out.append({"step": step, **{k: mean([p[k] for p in points]) for k in ("rollouts", "generated_tokens", "accuracy")},
                    "accuracy_by_hops": {h: mean([p.get("accuracy_by_hops", {}).get(h) for p in points]) for h in hops}})
    return out


def first_reaching(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    for point in curve:
        if point["accuracy"] is not None and point["accuracy"] >= target - 1e-9:
            return point[key]
    return None


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    curves = {name: mean_curve(rs) for name, rs in runs.items()}
    grpo = runs.get("grpo")
    target = mean([r["final"]["unseen"] for r in grpo]) if grpo else None
    grpo_tokens = curves["grpo"][-1]["generated_tokens"] if grpo else None
    methods = {}
    for name, rs in runs.items():
        finals = [r["final"]["unseen"] for r in rs]
        tokens = first_reaching(curves[name], target, "generated_tokens") if target is not None else None
        tokens_90 = first_reaching(curves[name], 0.9 * target, "generated_tokens") if target is not None else None
        methods[name] = {
            "final_accuracy_mean": mean(finals),
            "final_accuracy_std": std(finals),
            "final_accuracy_by_hops": hops_summary(rs),
            "effective_ratio_mean": mean([e for r in rs for e in r["effective_ratio"]]),
            "tokens_to_grpo_final": tokens,
            "rollouts_to_grpo_final": first_reaching(curves[name], target, "rollouts") if target is not None else None,
            "tokens_fraction_of_grpo": tokens / grpo_tokens if tokens is not None and grpo_tokens else None,
            "tokens_to_90pct_grpo_final": tokens_90,
            "train_accuracy_mean": mean([r["final"]["train"] for r in rs]),
            "redrawn_accuracy_mean": mean([r["final"]["redrawn"] for r in rs]),
            "train_accuracy_by_hops": hops_summary(rs, "train"),
            "redrawn_accuracy_by_hops": hops_summary(rs, "redrawn"),
            "total_generated_tokens_mean": curves[name][-1]["generated_tokens"],
            "total_rollouts_mean": curves[name][-1]["rollouts"],
            "step_seconds_mean": mean([s for r in rs for s in r["step_seconds"]]),
            "seeds": len(rs),
            **protocol_summary(rs, grpo),
        }
    if grpo:
        for m in methods.values():
            eff = methods["grpo"]["effective_ratio_mean"]
            m["effective_ratio_vs_grpo"] = m["effective_ratio_mean"] / eff if eff else None
        add_holm(methods)
    first = curves[next(iter(curves))][0]
    out = {"methods": methods, "grpo_final_accuracy": target, "grpo_total_tokens": grpo_tokens, "curves": curves,
           "base_accuracy": first["accuracy"], "base_accuracy_by_hops": first.get("accuracy_by_hops", {})}
    keys = sampled_keys([r["sampled"] for rs in runs.values() for r in rs if r.get("sampled")])
    factorial = {f"sampled_{k}": factorial_2x2(runs, lambda r, k=k: (r.get("sampled") or {}).get(k)) for k in keys}
    if any(factorial.values()):
        out["factorial_2x2"] = factorial
    return out


def sampled_keys(sampled: list[dict[str, float]]) -> list[str]:
    """The sampled endpoint's keys over runs: ``all`` first, then the hop counts."""
    return sorted({k for s in sampled for k in s}, key=lambda k: (k != "all", k))


def gains(rs: list[dict[str, Any]], key: str) -> list[float]:
    """Per seed, the run's final sampled success minus its base model's on ``key`` (``all`` or a hop
    count), where both were measured."""
    return [r["sampled"][key] - r["sampled_base"][key] for r in rs
            if (r.get("sampled") or {}).get(key) is not None and (r.get("sampled_base") or {}).get(key) is not None]


def protocol_summary(rs: list[dict[str, Any]], grpo: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Issue 25's fields of one arm: sampled success per hop, hop share, collapses, escapes, paired tests
    (:func:`protocol.paired_stats` per metric; ``p_holm`` is set over the arms by :func:`protocol.add_holm`)."""
    sampled = [r["sampled"] for r in rs if r.get("sampled")]
    if not sampled:
        return {}
    keys = sampled_keys(sampled)
    out: dict[str, Any] = {
        "sampled_by_hops": {k: {"mean": mean([s.get(k) for s in sampled]), "std": std([s.get(k) for s in sampled]),
                                "seeds": len(sampled)} for k in keys},
        "hop_share_mean": {h: mean([r.get("hop_share", {}).get(h) for r in rs])
                           for h in sorted({h for r in rs for h in r.get("hop_share", {})}, key=int)},
        "collapses": sum(collapsed(r) for r in rs),
        "collapse_rule": COLLAPSE_RULE,
        "escape": escape_summary(rs),
        # the arm's own gain: its final sampled success minus the base model's, same questions and stream, by seed
        "gain_over_base": {f"sampled_{k}": paired_stats(gains(rs, k)) for k in keys},
    }
    if grpo:
        paired = {f"sampled_{k}": paired_stats(paired_deltas(rs, grpo, lambda r, k=k: (r.get("sampled") or {}).get(k)))
                  for k in keys}
        paired["greedy_all"] = paired_stats(paired_deltas(rs, grpo, _greedy_unseen))
        for h in keys[1:]:
            paired[f"greedy_{h}"] = paired_stats(paired_deltas(
                rs, grpo, lambda r, h=h: r.get("final_by_hops", {}).get("unseen", {}).get(h)))
        paired["effective_ratio"] = paired_stats(paired_deltas(rs, grpo, lambda r: mean(r["effective_ratio"])))
        out["paired_vs_grpo"] = paired
    return out


def _sampled_all(run: dict[str, Any]) -> float | None:
    return (run.get("sampled") or {}).get("all")


def _greedy_unseen(run: dict[str, Any]) -> float | None:
    return run["final"]["unseen"]


def _base_sampled_all(run: dict[str, Any]) -> float | None:
    return (run.get("sampled_base") or {}).get("all")


def _difference(value: Any, a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """``value(a) - value(b)``, or None where either run lacks the value."""
    va, vb = value(a), value(b)
    return None if va is None or vb is None else va - vb


def cpu_blocks(runs: dict[str, list[dict[str, Any]]], seed_cpu: dict[int, Any]) -> dict[str, Any]:
    """Descriptive, beside a verdict whose seeds ran on two or more CPU types: per type, its seeds and
    each arm's paired difference from GRPO on them (sampled and greedy, all questions). Empty when
    every seed ran on one type."""
    types = sorted({str(c) for c in seed_cpu.values()})
    if len(types) < 2 or "grpo" not in runs:
        return {}
    out: dict[str, Any] = {}
    for cpu in types:
        seeds = sorted(s for s, c in seed_cpu.items() if str(c) == cpu)
        block = {m: [r for r in rs if r["seed"] in seeds] for m, rs in runs.items()}
        out[cpu] = {"seeds": seeds, "paired_vs_grpo": {
            m: {"sampled_all": paired_stats(paired_deltas(rs, block["grpo"], _sampled_all)),
                "greedy_all": paired_stats(paired_deltas(rs, block["grpo"], _greedy_unseen))}
            for m, rs in block.items() if m != "grpo"}}
    return out


def same_steps(a: list[float], b: list[float]) -> int:
    """How many leading training steps two runs' mean rewards are identical for."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def machine_pairs(runs: dict[str, list[dict[str, Any]]], seed_cpu: dict[int, Any],
                  others: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """Descriptive: counted runs made again, same arm and seed, on another CPU type (``others``: shard
    path and contents). Per pair, the value on the first type (alphabetically) minus the second's:
    final sampled and greedy success and the base model's sampled success, and the steps for which
    the two runs' mean rewards stayed identical; over the pairs, :func:`protocol.paired_stats`."""
    pairs: list[dict[str, Any]] = []
    for path, shard in others:
        cpu = str(recorded(shard, "machine", "cpu"))
        for method, rs in shard["runs"].items():
            for run in rs:
                counted = next((r for r in runs.get(method, []) if r["seed"] == run["seed"]), None)
                if counted is None:
                    raise SystemExit(f"{path}: no merged {method} run of seed {run['seed']} to compare it with")
                counted_cpu = str(seed_cpu[run["seed"]])
                if counted_cpu == cpu:
                    raise SystemExit(f"{path}: {method} seed {run['seed']} ran on {cpu}, as the merged run did; "
                                     "--other-cpu takes runs from another CPU type")
                a, b = (run, counted) if cpu < counted_cpu else (counted, run)
                pairs.append({"arm": method, "seed": run["seed"], "cpus": sorted([cpu, counted_cpu]), "shard": path.name,
                              "sampled_all": _difference(_sampled_all, a, b),
                              "greedy_all": _difference(_greedy_unseen, a, b),
                              "base_sampled_all": _difference(_base_sampled_all, a, b),
                              "same_reward_steps": same_steps(run["reward_mean"], counted["reward_mean"])})
    types = sorted({str(c) for c in seed_cpu.values()} | {c for p in pairs for c in p["cpus"]})
    if len(types) > 2:
        raise SystemExit(f"--other-cpu: runs from {len(types)} CPU types ({', '.join(types)}); compare two")
    return {"difference": f"{types[0]} minus {types[-1]}", "pairs": pairs,
            **{k: paired_stats([p[k] for p in pairs if p[k] is not None])
               for k in ("sampled_all", "greedy_all", "base_sampled_all")}}


def plot(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for name, curve in summary["curves"].items():
        style = {"lw": 2.4} if name == "trace" else {"lw": 1.3}
        axes[0, 0].plot([p["generated_tokens"] for p in curve], [p["accuracy"] for p in curve], marker="o", label=name, **style)
        axes[0, 1].plot([p["rollouts"] for p in curve], [p["accuracy"] for p in curve], marker="o", label=name, **style)
        per_step = [mean(list(v)) for v in zip(*[r["effective_ratio"] for r in runs[name]], strict=True)]
        axes[1, 0].plot(range(1, len(per_step) + 1), per_step, label=name, **style)
    if summary["grpo_final_accuracy"] is not None:
        for ax in (axes[0, 0], axes[0, 1]):
            ax.axhline(summary["grpo_final_accuracy"], color="grey", ls=":", lw=1)
    names = list(summary["methods"])
    splits = (("train_accuracy_mean", "seen world"), ("final_accuracy_mean", "unseen world"),
              ("redrawn_accuracy_mean", "re-drawn facts"))
    for j, (key, label) in enumerate(splits):
        values = [summary["methods"][n][key] or 0.0 for n in names]
        axes[1, 1].bar([i + 0.27 * (j - 1) for i in range(len(names))], values, width=0.27, label=label)
    axes[1, 1].set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    axes[0, 0].set(xlabel="generated tokens (cumulative, seed mean)", ylabel="held-out accuracy (unseen world)",
                   title="Accuracy vs generated tokens")
    axes[0, 1].set(xlabel="continuation rollouts (cumulative)", ylabel="held-out accuracy", title="Accuracy vs rollouts")
    axes[1, 0].set(xlabel="step", ylabel="effective ratio", title="Share of mixed groups per step", ylim=(0, 1))
    axes[1, 1].set(ylabel="final accuracy", title="What generalises: seen vs unseen world")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out)


def merge_shards(paths: list[Path], methods: list[str] | None = None) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Runs of several shard files, method order as in :data:`METHODS`; their settings must agree.
    ``methods``: keep only these arms (one table of chosen arms: Holm's family is its arms)."""
    shards = [read_shard(p) for p in paths]
    for path, shard in zip(paths, shards, strict=True):  # every shard whole, before anything is written
        check_shard(path, shard, METHODS + ABLATIONS + OPTIONS + MECHANISMS)

    check_one_setting(paths, shards)
    check_one_base_model(paths, shards)
    seed_cpu = check_one_cpu_per_seed(paths, shards)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS + ABLATIONS + OPTIONS + MECHANISMS}
    for path, shard in zip(paths, shards, strict=True):
        for method, rs in shard["runs"].items():
            for run in rs:  # a method's run of one seed held by two shards (grpo beside each arm) counts once
                twin = next((r for r in runs[method] if r["seed"] == run["seed"]), None)
                if twin is None:
                    runs[method].append(run)
                elif (twin["final"], twin.get("sampled")) != (run["final"], run.get("sampled")):
                    raise SystemExit(f"{path}: {method} seed {run['seed']} differs from the run another shard holds")
    runs = {m: sorted(rs, key=lambda r: r["seed"]) for m, rs in runs.items() if rs and (not methods or m in methods)}
    if not runs:
        raise ShardError(f"{', '.join(p.name for p in paths)}: no runs of {', '.join(methods or [])} to merge")
    check_aligned(runs, paths)
    seconds = sum(shard["seconds"] for shard in shards)
    setting = {**shards[0]["setting"], "seeds": max(len(rs) for rs in runs.values())}
    return runs, {**shards[0], "setting": setting, "seconds": seconds, "shards": [p.name for p in paths],
                  "seed_cpu": seed_cpu}


def check_one_setting(paths: list[Path], shards: list[dict[str, Any]]) -> None:
    """Refuse (``SystemExit`` naming the file) shards whose settings differ (their seeds aside)."""
    def same(shard: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in shard["setting"].items() if k != "seeds"}

    for path, shard in zip(paths[1:], shards[1:], strict=True):
        if same(shard) != same(shards[0]):
            raise SystemExit(f"{path}: its setting differs from {paths[0]}'s; shards must share one setting")


def read_other_cpu(paths: list[Path], merged_path: Path, merged: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """The ``--other-cpu`` shards, each whole and of the setting and base model of ``merged`` (the
    merge's first shard, read from ``merged_path``)."""
    shards = [read_shard(p) for p in paths]
    for path, shard in zip(paths, shards, strict=True):
        check_shard(path, shard, METHODS + ABLATIONS + OPTIONS + MECHANISMS)
    check_one_setting([merged_path, *paths], [merged, *shards])
    check_one_base_model([merged_path, *paths], [merged, *shards])
    return list(zip(paths, shards, strict=True))


def main() -> None:
    args = _args()
    clock = time.perf_counter()
    if args.merge:
        runs, shard = merge_shards(args.merge, args.merge_methods)
        setting, quick, seconds = shard["setting"], shard.get("quick", False), shard["seconds"]
        extra = {"shards": shard["shards"], "shard_seconds_total": seconds, "provenance": shard.get("provenance"),
                 **{k: shard.get(k) for k in ("machine", "python", "torch", "threads", "cpus")},
                 "shard_git": {p.name: read_shard(p).get("git") for p in args.merge}}  # each shard's commit (issue 48)
        blocks = cpu_blocks(runs, shard["seed_cpu"])  # descriptive, beside the verdict
        if blocks:
            extra["cpu_blocks"] = blocks
        if args.other_cpu:
            extra["other_cpu"] = machine_pairs(runs, shard["seed_cpu"], read_other_cpu(args.other_cpu, args.merge[0], shard))
    else:
        configure_torch(args.threads)
        overrides = sweep_overrides(args)
        # the base model, machine and commit as the runs start: the code they run is the code loaded now,
        # whatever the checkout holds when they end
        extra = {**machine(), "provenance": provenance_of(resolve("grpo", overrides, args.smoke))}
        extra["git"] = extra["provenance"]["git"]
        runs = {m: [] for m in args.methods}
        base: dict[int, dict[str, float]] = {}
        for seed in args.seed_list:  # seed-major: a partial sweep still compares every method
            for method in args.methods:
                runs[method].append(run_one(method, seed, overrides, args, base))
        setting = {"overrides": overrides, "smoke": args.smoke, "hard": args.hard, "name": args.setting,
                   **describe_config(resolve("grpo", overrides, args.smoke)),
                   "steps": args.steps, "seeds": len(args.seed_list), "final_eval_questions": args.final_eval,
                   "sampled_questions": args.sampled_eval, "sampled_samples": args.samples,
                   "held_out": "test split of an unseen world (data.eval_fact_seed)",
                   "train_split": "training questions of the training worlds (seen)",
                   "redrawn_split": "training questions, facts re-drawn (data.redrawn_fact_seed)"}
        quick, seconds = args.quick, time.perf_counter() - clock
    summary = summarise(runs)
    result = {
        "methods": summary["methods"],
        "grpo_final_accuracy": summary["grpo_final_accuracy"],
        "grpo_total_tokens": summary["grpo_total_tokens"],
        "base_accuracy": summary["base_accuracy"],
        "base_accuracy_by_hops": summary["base_accuracy_by_hops"],
        "questions_per_hop": questions_per_hop(setting),
        "grpo_improved": (summary["grpo_final_accuracy"] or 0.0) > (summary["base_accuracy"] or 0.0),
        **({"factorial_2x2": summary["factorial_2x2"]} if "factorial_2x2" in summary else {}),
        "setting": setting,
        "curves": summary["curves"],
        "runs": runs,
        "quick": quick,
        "seconds": seconds,
        **extra,
    }
    write_json(args.out, result)
    png = plot(summary, runs, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png} ({result['seconds']:.0f} s)")
    for name, m in summary["methods"].items():
        gain = m.get("gain_over_base", {}).get("sampled_all") or {}
        over = (f"  sampled gain over base {100 * gain['mean']:+.2f} [{100 * gain['lo']:+.2f}, {100 * gain['hi']:+.2f}]"
                if gain.get("lo") is not None else "")
        print(f"{name:>12}: final {m['final_accuracy_mean']:.3f}  eff {m['effective_ratio_mean']:.3f}  "
              f"tokens_to_grpo_final {m['tokens_to_grpo_final']}{over}")
    for cpu, block in result.get("cpu_blocks", {}).items():
        print(f"seeds {block['seeds']} on {cpu} (descriptive): " + ", ".join(
            f"{arm} {_points(cell['sampled_all'])}" for arm, cell in block["paired_vs_grpo"].items()))
    if "other_cpu" in result:
        other = result["other_cpu"]
        print(f"same arm and seed on two CPU types, {other['difference']} ({len(other['pairs'])} pairs): sampled "
              f"{_points(other['sampled_all'])}, greedy {_points(other['greedy_all'])}, base sampled "
              f"{_points(other['base_sampled_all'])}")


def _points(stats: dict[str, Any]) -> str:
    """A paired_stats mean and 95% t-interval in points, or '-' where it has none."""
    if stats.get("lo") is None:
        return "-" if stats.get("mean") is None else f"{100 * stats['mean']:+.2f}"
    return f"{100 * stats['mean']:+.2f} [{100 * stats['lo']:+.2f}, {100 * stats['hi']:+.2f}]"


if __name__ == "__main__":
    main()
