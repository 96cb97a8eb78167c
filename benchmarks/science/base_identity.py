"""Which base model did an older results file start from? Re-measure its base figures on the shipped one.

Training results written before the testbed's base models shipped with the package record no
sha256 of their base model. What a run measures before its first update depends only on the
base model, the setting and the seed: the greedy held-out accuracy per hop count (step 0 of the
curve) and, where the file has it, the sampled endpoint on the base model (300 questions x 4
samples, ``sampled_base``). This script measures those figures on the shipped base of each
setting and compares them, digit for digit, with every results file in ``benchmarks/results``
that records them for the same setting and seed.

A file is ``identified`` when every figure it shares with the re-measurement is equal and at
least one of them is not zero (an all-zero base rate identifies nothing), ``differs`` when one
is not equal, and ``not comparable`` when it shares no seed or records no base figure. Equal
figures over hundreds of episodes are strong evidence of the same weights, not proof; a file
that differs was made on another pretraining draw (or in a setting since changed) and its
figures say nothing about the shipped base.

    python benchmarks/science/base_identity.py                      # bench, credit and demo, seeds 0 and 1
    python benchmarks/science/base_identity.py --settings credit --seeds 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, add_config_args, configure_torch, fresh_dir, machine, provenance_of, resolve, write_json
from sample_efficiency import SETTINGS, by_hops, preset_overrides, sampled_success, sweep_overrides


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["bench", "credit", "demo"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sampled-eval", type=int, default=300, help="As sample_efficiency.py's (its default).")
    p.add_argument("--samples", type=int, default=4, help="As sample_efficiency.py's (its default).")
    p.add_argument("--files", type=Path, nargs="+", help="Results files to compare (default: every one in benchmarks/results).")
    p.add_argument("--out", type=Path, default=RESULTS / "base_identity.json")
    add_config_args(p)
    args = p.parse_args()
    args.quick = False
    return args


def measure(setting: str, seed: int, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The base figures a ``sample_efficiency.py`` run of ``setting`` and ``seed`` records before
    training (its own code: the grpo preset's trainer, step-0 evaluation, sampled endpoint)."""
    from tracerl.train.loop import Trainer

    args.setting = setting
    overrides = sweep_overrides(args)
    config = resolve("grpo", preset_overrides("grpo", overrides) + [f"seed={seed}"], args.smoke)
    trainer = Trainer(config, fresh_dir(args.work_dir / f"{setting}-seed{seed}"))
    greedy = trainer.evaluate(trainer.data.held_out)
    figures = {"greedy": greedy["eval_accuracy"], "greedy_by_hops": by_hops(greedy, "eval_accuracy_hops"),
               "sampled": sampled_success(trainer, seed, args)}
    return figures, config


def setting_of(data: dict[str, Any]) -> str | None:
    """The sample_efficiency setting a results file ran in: its recorded name, else read from the
    overrides (files written before the name was recorded)."""
    setting = data.get("setting")
    if not isinstance(setting, dict):
        return None
    if setting.get("name"):
        return str(setting["name"])
    overrides = setting.get("overrides") or []
    if "model.tiny_preset=bench_hops_lookalike" in overrides:
        return "lookalike"
    if "model.tiny_preset=bench_hops" in overrides:
        return "credit" if "data.world.min_hops=2" in overrides else "bench"
    return "demo" if not any(o.startswith("model.tiny_preset=") for o in overrides) else None


def recorded(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per seed, the base figures a sample_efficiency results file holds (the first run of the seed)."""
    out: dict[int, dict[str, Any]] = {}
    runs = data.get("runs")
    if not isinstance(runs, dict):
        return out
    for arm in runs.values():
        for run in arm if isinstance(arm, list) else []:
            if not isinstance(run, dict) or "seed" not in run or run["seed"] in out or not run.get("curve"):
                continue
            out[run["seed"]] = base_of(run)
    return out


def base_of(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures measured before its first update: greedy accuracy (and per hop count) at
    step 0 of its curve, and the sampled endpoint on the base model."""
    first = (run.get("curve") or [{}])[0]
    return {"greedy": first.get("accuracy"), "greedy_by_hops": first.get("accuracy_by_hops"),
            "sampled": run.get("sampled_base")}


def compare(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Figure by figure: equal, or both values when not; a figure the file lacks is left out."""
    out: dict[str, Any] = {}
    for key in ("greedy", "greedy_by_hops", "sampled"):
        if theirs.get(key) is None or mine.get(key) is None:
            continue
        out[key] = True if _round(theirs[key]) == _round(mine[key]) else {"file": theirs[key], "shipped": mine[key]}
    return out


def _round(value: Any) -> Any:
    """Files round to 4 digits; a re-measurement is compared at the same precision."""
    if isinstance(value, dict):
        return {str(k): _round(v) for k, v in value.items()}
    return round(float(value), 4)


def _nonzero(value: Any) -> bool:
    return any(_nonzero(v) for v in value.values()) if isinstance(value, dict) else bool(value)


def verdict(checks: dict[int, dict[str, Any]], mine: dict[int, dict[str, Any]]) -> str:
    """``identified``, ``differs`` or ``not comparable`` (module docstring)."""
    compared = [(seed, key) for seed, figures in checks.items() for key in figures]
    if not compared:
        return "not comparable"
    if any(checks[seed][key] is not True for seed, key in compared):
        return "differs"
    return "identified" if any(_nonzero(mine[seed][key]) for seed, key in compared) else "not comparable"


def main() -> None:
    args = _args()
    configure_torch(args.threads)
    clock = time.perf_counter()
    measured: dict[str, dict[int, dict[str, Any]]] = {}
    bases: dict[str, Any] = {}
    for setting in args.settings:
        measured[setting] = {}
        for seed in args.seeds:
            measured[setting][seed], config = measure(setting, seed, args)
            print(f"{setting} seed {seed}: {json.dumps(measured[setting][seed])}", flush=True)
        bases[setting] = provenance_of(config)["base_model"]
    files = args.files or sorted(p for p in RESULTS.glob("*.json") if p.name != args.out.name)
    table: dict[str, Any] = {}
    for path in files:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        setting, figures = setting_of(data), recorded(data)
        if setting not in measured or not figures:
            continue
        own_sha = ((data.get("provenance") or {}).get("base_model") or {}).get("sha256")
        checks = {seed: compare(measured[setting][seed], figures[seed]) for seed in sorted(figures) if seed in measured[setting]}
        table[path.name] = {"setting": setting, "recorded_sha256": own_sha, "seeds": checks,
                            "verdict": verdict(checks, measured[setting])}
        print(f"{path.name}: {setting} {table[path.name]['verdict']}", flush=True)
    write_json(args.out, {
        "what": "base-model figures re-measured on the shipped bases, compared with each results file's own",
        "settings": args.settings, "seeds": args.seeds, "sampled_questions": args.sampled_eval, "samples": args.samples,
        "base_models": bases, "measured": measured, "files": table,
        "seconds": time.perf_counter() - clock, **machine(), "provenance": provenance_of(name_or_path=None),
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
