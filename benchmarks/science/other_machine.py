"""Does a shard re-run on another machine give the committed figures?

Reads the committed ``sample_efficiency.py`` results of one method and setting and a re-run of the
same documented shard command on another machine, and pairs them by seed. Two checks:

- **base figures, exactly**: what a run measures before its first update depends only on the
  shipped base model, the setting and the seed (greedy held-out accuracy, step 0 of the curve, and
  the sampled endpoint on the base, ``sampled_base``), so they must be equal to the digit;
- **trained figures, within the committed spread**: float rounding differs between CPUs and
  library builds, so two machines' runs of one seed part after a few updates and are two draws;
  each re-run seed's endpoint is set against the committed seeds' range, and the paired
  difference (re-run minus committed, same seed) gets a 95% t-interval and a sign-flip p-value,
  which show a shift common to all seeds that a range alone would hide.

    python benchmarks/science/other_machine.py --method grpo \\
        --committed benchmarks/results/credit_lookalike_shard_s0.json benchmarks/results/credit_lookalike_shard_g_s*.json \\
        --rerun benchmarks/results/other_machine/credit_lookalike_g_s*.json \\
        --out benchmarks/results/other_machine_lookalike_grpo.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from base_identity import base_of
from common import mean, rounded, std, write_json
from protocol import paired_stats

# endpoint name -> how to read it from one seed's run record
ENDPOINTS = {
    "sampled_all": lambda run: (run.get("sampled") or {}).get("all"),
    "sampled_2": lambda run: (run.get("sampled") or {}).get("2"),
    "sampled_3": lambda run: (run.get("sampled") or {}).get("3"),
    "greedy_unseen": lambda run: (run.get("final") or {}).get("unseen"),
}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", required=True)
    p.add_argument("--committed", type=Path, nargs="+", required=True)
    p.add_argument("--rerun", type=Path, nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def runs_by_seed(paths: list[Path], method: str) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """``method``'s run record per seed from results files, and each file's machine and base model.
    A seed found twice, or a file with another base model than the first, is an error."""
    runs: dict[int, dict[str, Any]] = {}
    sources: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        if method not in data.get("runs", {}):
            raise SystemExit(f"{path}: no runs of method {method!r}")
        base = (data.get("provenance") or {}).get("base_model", {}).get("sha256")
        if sources and base != sources[0]["base_sha256"]:
            raise SystemExit(f"{path}: base model {base} differs from {sources[0]['file']}'s {sources[0]['base_sha256']}")
        machine = (data.get("provenance") or {}).get("machine", {})
        sources.append({"file": path.name, "base_sha256": base, "machine": machine})
        for run in data["runs"][method]:
            if run["seed"] in runs:
                raise SystemExit(f"{path}: seed {run['seed']} of {method!r} is also in another file")
            runs[run["seed"]] = run
    return runs, sources


def compare(committed: dict[int, dict[str, Any]], rerun: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per seed both sides' base and trained figures; per endpoint the committed and re-run
    mean, sd and range, how many re-run seeds lie inside the committed range, and the paired
    difference's t-interval and sign-flip p-value."""
    seeds = sorted(set(committed) & set(rerun))
    if not seeds:
        raise SystemExit("the committed and re-run files share no seed")
    per_seed = {}
    for s in seeds:
        a, b = base_of(committed[s]), base_of(rerun[s])
        per_seed[str(s)] = {"base_equal": a == b, "base": a, "base_rerun": b,
                            **{name: {"committed": read(committed[s]), "rerun": read(rerun[s])}
                               for name, read in ENDPOINTS.items()}}
    endpoints = {}
    for name, read in ENDPOINTS.items():
        pairs = [(read(committed[s]), read(rerun[s])) for s in seeds]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        if not pairs:
            continue
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        deltas = [y - x for x, y in pairs]
        endpoints[name] = {
            "committed": {"mean": mean(xs), "sd": std(xs), "min": min(xs), "max": max(xs)},
            "rerun": {"mean": mean(ys), "sd": std(ys), "min": min(ys), "max": max(ys)},
            "rerun_within_committed_range": sum(min(xs) <= y <= max(xs) for y in ys),
            "n": len(pairs),
            "paired_rerun_minus_committed": {**paired_stats(deltas),
                                             "lower": sum(d < 0 for d in deltas), "higher": sum(d > 0 for d in deltas)},
        }
    return {"seeds": seeds, "base_equal_seeds": sum(v["base_equal"] for v in per_seed.values()),
            "per_seed": per_seed, "endpoints": endpoints}


def main() -> None:
    args = _args()
    committed, committed_sources = runs_by_seed(args.committed, args.method)
    rerun, rerun_sources = runs_by_seed(args.rerun, args.method)
    if committed_sources[0]["base_sha256"] != rerun_sources[0]["base_sha256"]:
        raise SystemExit(f"the re-run's base model {rerun_sources[0]['base_sha256']} is not the committed "
                         f"{committed_sources[0]['base_sha256']}")
    result = {"what": __doc__.split("\n\n")[0], "method": args.method,
              "committed_machines": sorted({json.dumps(s["machine"], sort_keys=True) for s in committed_sources}),
              "rerun_machines": sorted({json.dumps(s["machine"], sort_keys=True) for s in rerun_sources}),
              "base_sha256": committed_sources[0]["base_sha256"], **rounded(compare(committed, rerun), 5)}
    write_json(args.out, result)
    print(f"wrote {args.out}: base figures equal on {result['base_equal_seeds']} of {len(result['seeds'])} seeds")
    for name, e in result["endpoints"].items():
        d = e["paired_rerun_minus_committed"]
        print(f"{name:>14}: committed {e['committed']['mean']:.4f} [{e['committed']['min']:.4f}, {e['committed']['max']:.4f}]"
              f"  re-run {e['rerun']['mean']:.4f}  within range {e['rerun_within_committed_range']}/{e['n']}"
              f"  paired {d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] sign-flip p {d['p_signflip']:.4f}")


if __name__ == "__main__":
    main()
