"""Episode statistics of finished training runs, read from their run folders.

A ``sample_efficiency.py`` results file keeps each run's endpoints and curves, not its step
records. This reads the step records (``metrics.jsonl``) of finished runs and summarises, per run:
tool calls executed and turns per episode over all steps and over the first and last ten (a tree
runs a shared prefix's calls once, so a tree arm executes fewer calls than its episodes hold), and,
for credit arms, the share of mixed-group transitions whose turn term flips the outcome term's sign
(``credit_mixed_flip_share``). Descriptive only.

    python benchmarks/science/step_metrics.py --runs RUN_DIR [RUN_DIR ...] --out benchmarks/results/NAME.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import mean, write_json

from tracerl.runs.metrics import read_metrics
from tracerl.runs.run_config import read_run_config

EDGE = 10
"""Steps in each of the first and last windows."""


def per_episode(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Tool calls executed and turns per episode over ``records``: each step's totals summed, divided
    by the episodes (``trajectories``) summed, so a step weighs by its episodes."""
    episodes = sum(r["trajectories"] for r in records)
    if not episodes:
        return {"tool_calls_executed": None, "turns": None}
    return {"tool_calls_executed": sum(r["tool_calls"] for r in records) / episodes,
            "turns": _turns(records)}


def _turns(records: list[dict[str, Any]]) -> float | None:
    """Turns per episode: ``turns_mean`` is over a step's episodes that did not fail in the
    infrastructure (``trajectories - infra_failed``), so it weighs by those."""
    valid = [(r["trajectories"] - r.get("infra_failed", 0), r["turns_mean"]) for r in records]
    n = sum(v for v, _ in valid)
    return sum(v * t for v, t in valid) / n if n else None


def flips(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The turn term's sign flips in mixed groups: over the steps that had mixed transitions (the
    metric is null or NaN on the others), their number, the mean share, and how many had one. None
    for a run that records no credit (GRPO, learned roots without credit)."""
    if not any("credit_mixed_flip_share" in r for r in records):
        return None
    shares = [r["credit_mixed_flip_share"] for r in records
              if r.get("credit_mixed_flip_share") is not None and not math.isnan(r["credit_mixed_flip_share"])]
    return {"steps_with_mixed_transitions": len(shares), "mean_share": mean(shares) if shares else None,
            "steps_with_a_flip": sum(s > 0 for s in shares)}


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's episode statistics (see the module's docstring)."""
    return {"steps": len(records), "per_episode": per_episode(records),
            "per_episode_first": per_episode(records[:EDGE]), "per_episode_last": per_episode(records[-EDGE:]),
            "effective_ratio_mean": mean([r["effective_ratio"] for r in records]),
            "credit_mixed_flips": flips(records)}


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished run's preset, seed and summary; a run with fewer step records than its config's
    ``steps`` is an error naming the folder."""
    config = read_run_config(run_dir / "config.yaml")
    records = read_metrics(run_dir)
    if len(records) != config.steps:
        raise SystemExit(f"{run_dir}: {len(records)} step records, its config asks for {config.steps}: "
                         "not a finished run")
    return {"method": config.preset, "seed": config.seed, "run_dir": run_dir.name, **summarise(records)}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="finished run folders")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def main() -> None:
    args = _args()
    runs = sorted((read_run(d) for d in args.runs), key=lambda r: (r["seed"], r["method"]))
    write_json(args.out, {"what": __doc__.split("\n\n")[0], "edge_steps": EDGE, "runs": runs})
    print(f"wrote {args.out}")
    for r in runs:
        e, f = r["per_episode"], r["credit_mixed_flips"]
        print(f"{r['method']:>20} seed {r['seed']}: {e['tool_calls_executed']:.2f} calls executed, {e['turns']:.2f} turns "
              "an episode"
              + ("" if f is None else f"; flips in {f['steps_with_a_flip']} of {f['steps_with_mixed_transitions']} "
                                       f"steps with mixed transitions, mean share "
                                       f"{'-' if f['mean_share'] is None else format(f['mean_share'], '.4f')}"))


if __name__ == "__main__":
    main()
