"""Learned roots against GRPO at lr 1e-3: the tuned-baseline controls on the credit testbed (issue 48 item 4).

The mechanisms shards (``mechanisms_credit_shard_s*.json``: learned roots without the tree,
``trace_alloc_notree``, and GRPO / GRPO on two-hop prompts only at lr 3e-4) are set beside control
shards of the same sweep at ``--set optim.lr=1e-3`` (``mechanisms_lr1e3_shard_s*.json``: ``grpo``,
``grpo_twohop``), so learned roots' gain is also tested against a baseline whose learning rate is
not what kept it in the all-fail regime. Before anything is written:

- every shard is checked whole (benchmarks/shards.py, through ``sample_efficiency.merge_shards``:
  schema, finite numbers, one setting and one base model per set, each seed once, aligned runs);
- the two sets must share everything but the learning rate: the setting (its overrides less every
  ``optim.lr=``, the world, budget, evaluation protocol, steps), the base model's sha256, the
  held-out questions per hop, and the seeds (every control seed is a reference seed);
- a seed gives the same held-out questions and base model in both sets, so each seed's base
  figures (greedy at step 0 and the sampled endpoint before training) must be equal in every run
  of that seed.

Any failure is one line naming the file and the field. Per arm, on the seeds all five arms hold:
sampled success (all, 2-hop, 3-hop), greedy held-out accuracy and escapes (protocol.ESCAPE_RULE);
per comparison, paired differences by seed with 95% t-intervals, the exact sign-flip p-value and
Holm over the table's comparisons per metric (protocol.paired_stats, stats.holm).

    .venv/bin/python benchmarks/science/lr_controls.py   # < 5 s; the shards already in benchmarks/results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
sys.path.insert(1, str(Path(__file__).resolve().parent))  # sample_efficiency's merge, also when imported by tests
from base_identity import base_of
from common import RESULTS, mean, std, write_json
from protocol import ALPHA, decide, escape_summary, paired_deltas, paired_stats
from sample_efficiency import merge_shards
from shards import ShardError, read_shard
from stats import holm, holm_thresholds

REFERENCE_LR = 3e-4
CONTROL_LR = 1e-3
REFERENCE_ARMS = ("trace_alloc_notree", "grpo", "grpo_twohop")
CONTROL_ARMS = ("grpo", "grpo_twohop")
ARMS = {"trace_alloc_notree": ("reference", "trace_alloc_notree"), "grpo@3e-4": ("reference", "grpo"),
        "grpo_twohop@3e-4": ("reference", "grpo_twohop"), "grpo@1e-3": ("control", "grpo"),
        "grpo_twohop@1e-3": ("control", "grpo_twohop")}
"""The table's arms: name -> (shard set, method in that set)."""
ARMS_META = {name: {"set": which, "method": method, "lr": REFERENCE_LR if which == "reference" else CONTROL_LR}
             for name, (which, method) in ARMS.items()}
COMPARISONS = {"learned roots minus GRPO at lr 1e-3": ("trace_alloc_notree", "grpo@1e-3"),
               "learned roots minus GRPO two-hop-only at lr 1e-3": ("trace_alloc_notree", "grpo_twohop@1e-3"),
               "GRPO at lr 1e-3 minus GRPO at lr 3e-4": ("grpo@1e-3", "grpo@3e-4")}
"""Paired ``arm - other`` by seed; Holm's family is these comparisons, per metric."""
METRICS = {"sampled_all": lambda r: (r.get("sampled") or {}).get("all"),
           "sampled_2": lambda r: (r.get("sampled") or {}).get("2"),
           "sampled_3": lambda r: (r.get("sampled") or {}).get("3"),
           "greedy_all": lambda r: r["final"]["unseen"]}
"""Endpoint -> its value in one run (the comparison protocol's: sampled success, greedy held-out accuracy)."""


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", type=Path, nargs="+",
                   default=sorted(RESULTS.glob("mechanisms_credit_shard_s*.json")),
                   help="Shards at lr 3e-4 holding trace_alloc_notree, grpo and grpo_twohop (default: "
                        "results/mechanisms_credit_shard_s*.json).")
    p.add_argument("--control", type=Path, nargs="+", default=sorted(RESULTS.glob("mechanisms_lr1e3_shard_s*.json")),
                   help="Shards of the same sweep at optim.lr=1e-3 holding grpo and grpo_twohop "
                        "(default: results/mechanisms_lr1e3_shard_s*.json, whichever seeds exist).")
    p.add_argument("--out", type=Path, default=RESULTS / "lr_controls.json")
    return p.parse_args()


def _no_lr(setting: dict[str, Any]) -> dict[str, Any]:
    """A shard setting without what may differ: the learning rate (field and overrides) and the seed count."""
    out = {k: v for k, v in setting.items() if k not in ("lr", "seeds")}
    out["overrides"] = [o for o in setting.get("overrides", []) if not str(o).startswith("optim.lr=")]
    return out


def check_same_but_lr(ref_name: str, ref: dict[str, Any], ctl_name: str, ctl: dict[str, Any]) -> None:
    """Refuse (one line) two merged shard sets that differ in anything but the learning rate.
    ``ref`` and ``ctl`` are ``merge_shards``' merged shard dicts (setting, provenance, questions_per_hop, quick)."""
    for name, shard, lr in ((ref_name, ref, REFERENCE_LR), (ctl_name, ctl, CONTROL_LR)):
        if shard["setting"].get("lr") != lr:
            raise ShardError(f"{name}: setting.lr is {shard['setting'].get('lr')}, expected {lr:g}")
    a, b = _no_lr(ref["setting"]), _no_lr(ctl["setting"])
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise ShardError(f"{ctl_name}: setting.{key} is {b.get(key)!r}, {ref_name} has {a.get(key)!r}; "
                             "the two shard sets must differ only in optim.lr")
    for key in ("questions_per_hop", "quick"):
        if ref.get(key) != ctl.get(key):
            raise ShardError(f"{ctl_name}: {key} is {ctl.get(key)!r}, {ref_name} has {ref.get(key)!r}; "
                             "the two shard sets must differ only in optim.lr")
    shas = [((s.get("provenance") or {}).get("base_model") or {}).get("sha256") for s in (ref, ctl)]
    if shas[0] is None or shas[0] != shas[1]:
        raise ShardError(f"{ctl_name}: base model sha256 {shas[1]} is not {ref_name}'s ({shas[0]}); "
                         "both sets must record one base model")


def check_seeds(ref_runs: dict[str, list[dict[str, Any]]], ctl_runs: dict[str, list[dict[str, Any]]],
                where: dict[tuple[str, str, int], str]) -> list[int]:
    """The paired seeds (those every arm holds), after refusing a missing arm, a control seed the
    reference lacks, or a seed whose base figures differ between any two of its runs. ``where``:
    (``reference``/``control``, method, seed) -> the shard file holding that run (for the message)."""
    sets = {"reference": (ref_runs, REFERENCE_ARMS), "control": (ctl_runs, CONTROL_ARMS)}
    for which, (runs, arms) in sets.items():
        for arm in arms:
            if not runs.get(arm):
                files = sorted({f for (w, _, _), f in where.items() if w == which})
                raise ShardError(f"{files[0]}: the {which} shards hold no runs of {arm}; needed: {', '.join(arms)}")
    ref_seeds = set.intersection(*({r["seed"] for r in ref_runs[a]} for a in REFERENCE_ARMS))
    for arm in CONTROL_ARMS:
        extra = sorted({r["seed"] for r in ctl_runs[arm]} - ref_seeds)
        if extra:
            raise ShardError(f"{where['control', arm, extra[0]]}: {arm} seed {extra[0]} has no run of every reference "
                             f"arm ({', '.join(REFERENCE_ARMS)}); pair seeds the reference holds")
    seeds = sorted(ref_seeds.intersection(*({r["seed"] for r in ctl_runs[a]} for a in CONTROL_ARMS)))
    if not seeds:
        raise ShardError(f"{where['control', CONTROL_ARMS[0], ctl_runs[CONTROL_ARMS[0]][0]['seed']]}: no seed that both "
                         "control arms ran; nothing to pair")
    for seed in seeds:
        of_seed = [(w, a, r) for w, (rs, _) in sets.items() for a in rs for r in rs[a] if r["seed"] == seed]
        first = base_of(of_seed[0][2])
        for which, arm, run in of_seed[1:]:
            if base_of(run) != first:
                w0, a0 = of_seed[0][0], of_seed[0][1]
                raise ShardError(f"{where[which, arm, seed]}: {arm} seed {seed}'s base figures {base_of(run)} differ from "
                                 f"{a0}'s {first} in {where[w0, a0, seed]}; a seed must start from one base on the "
                                 "same questions")
    return seeds


def origins(which: str, paths: list[Path]) -> dict[tuple[str, str, int], str]:
    """(``which``, method, seed) -> the name of the shard file that holds the run."""
    return {(which, method, run["seed"]): path.name for path in paths
            for method, runs in read_shard(path)["runs"].items() for run in runs}


def arm_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its paired seeds: each metric's mean, std and seeds, and escapes (Wilson interval)."""
    out: dict[str, Any] = {"seeds": len(runs)}
    for metric, value in METRICS.items():
        values = [value(r) for r in runs]
        out[metric] = {"mean": mean(values), "std": std(values), "seeds": sum(v is not None for v in values)}
    out["escape"] = escape_summary(runs)
    return out


def compare(arms: dict[str, list[dict[str, Any]]], alpha: float = ALPHA) -> dict[str, dict[str, Any]]:
    """Every comparison of :data:`COMPARISONS` per metric (``paired_stats`` plus ``lower``/``higher``
    seed counts), then Holm over the comparisons per metric and :func:`protocol.decide`'s reading."""
    out: dict[str, dict[str, Any]] = {}
    for label, (arm, other) in COMPARISONS.items():
        out[label] = {"arm": arm, "minus": other}
        for metric, value in METRICS.items():
            deltas = paired_deltas(arms[arm], arms[other], value)
            out[label][metric] = {**paired_stats(deltas), "lower": sum(d < 0 for d in deltas),
                                  "higher": sum(d > 0 for d in deltas)}
    for metric in METRICS:
        cells = [out[label][metric] for label in COMPARISONS]
        pvalues = [c["p_t"] for c in cells]
        for cell, p, step in zip(cells, holm(pvalues), holm_thresholds(pvalues, alpha), strict=True):
            cell["p_holm"] = p
            cell["decision"] = decide(cell["mean"], p, cell["p_signflip"], step, alpha)
    return out


def summarise(ref_paths: list[Path], ctl_paths: list[Path]) -> dict[str, Any]:
    """The results JSON of the two shard sets (every check first; :class:`ShardError` on a failure)."""
    ref_runs, ref = merge_shards(ref_paths, list(REFERENCE_ARMS))
    ctl_runs, ctl = merge_shards(ctl_paths, list(CONTROL_ARMS))
    ref_name, ctl_name = _names(ref_paths), _names(ctl_paths)
    check_same_but_lr(ref_name, ref, ctl_name, ctl)
    seeds = check_seeds(ref_runs, ctl_runs, {**origins("reference", ref_paths), **origins("control", ctl_paths)})
    sets = {"reference": ref_runs, "control": ctl_runs}
    arms = {name: [r for r in sets[which][method] if r["seed"] in seeds] for name, (which, method) in ARMS.items()}
    by_seed = {name: {r["seed"]: r for r in rs} for name, rs in arms.items()}
    setting = {**_no_lr(ref["setting"]), "seeds": len(seeds), "lr": {"reference": REFERENCE_LR, "control": CONTROL_LR}}
    return {
        "what": __doc__.split("\n\n")[0],
        "seeds": seeds,
        "n": len(seeds),
        "base_equal_per_seed": {str(s): True for s in seeds},
        "base_per_seed": {str(s): base_of(by_seed["grpo@1e-3"][s]) for s in seeds},
        "base_equal_note": "each seed's base figures (greedy at step 0, sampled before training) are equal in every "
                           "run of both sets, checked before anything was written",
        "arms": {name: {**ARMS_META[name], **arm_summary(rs)} for name, rs in arms.items()},
        "comparisons": compare(arms),
        "holm_family": "the comparisons of this table, per metric (t-test p-values; decision: protocol.decide)",
        "per_seed": {str(s): {name: {m: v(runs[s]) for m, v in METRICS.items()} for name, runs in by_seed.items()}
                     for s in seeds},
        "setting": setting,
        "questions_per_hop": ref.get("questions_per_hop"),
        "quick": bool(ref.get("quick")),
        "provenance": ref.get("provenance"),
        "sources": {which: {"shards": [p.name for p in paths], "shard_git": {p.name: read_shard(p).get("git") for p in paths},
                            "machine": (shard.get("provenance") or {}).get("machine")}
                    for which, paths, shard in (("reference", ref_paths, ref), ("control", ctl_paths, ctl))},
    }



def _names(paths: list[Path]) -> str:
    return paths[0].name if len(paths) == 1 else f"{paths[0].name} (and {len(paths) - 1} more)"


def main() -> None:
    args = _args()
    for flag, paths in (("--reference", args.reference), ("--control", args.control)):
        if not paths:
            raise SystemExit(f"{flag}: no shard files given or found in {RESULTS}")
    result = summarise(args.reference, args.control)
    write_json(args.out, result)
    print(f"wrote {args.out}: {result['n']} paired seeds {result['seeds']}, base figures equal on every seed")
    for label, c in result["comparisons"].items():
        s = c["sampled_all"]
        interval = f"[{100 * s['lo']:+.1f}, {100 * s['hi']:+.1f}]" if s["lo"] is not None else "(no interval)"
        tests = ", ".join(f"{name} p {s[key]:.3g}" for name, key in (("sign-flip", "p_signflip"), ("Holm", "p_holm"))
                          if s[key] is not None)
        print(f"  {label}: sampled {100 * s['mean']:+.1f} {interval} pts (n {s['n']}{'; ' + tests if tests else ''})")


if __name__ == "__main__":
    main()
