"""Which hop counts each stage-1 option spends on, replayed from per-hop success rates (no model).

Stage 1 with an exact predictor: every pool prompt's root value is its hop count's base success
rate (by default the shipped ``bench_hops`` base model's sampled success per hop on the ``bench``
testbed, seed 0, as ``base_identity.py`` measured it: ``results/base_identity.json``; ``--rates``
gives others), a pool of 16 prompts with hop counts drawn uniformly, the
testbed's budget (64 rollouts, groups of 8, stage 1 half of it), 2,000 pools. Reports the share
of stage-1 rollouts per hop count for the paper's stage 1 and each option (docs/TRACE.md
section 3): where the plan itself puts the budget, before any predictor error or training.

    python benchmarks/science/stage1_replay.py   # a few seconds
    python benchmarks/science/stage1_replay.py --rates 0.22 0.063 0.009 --out /tmp/replay.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, write_json

from tracerl.core.allocation import allocate_roots, exploration_prompts


def measured_rates(path: Path = RESULTS / "base_identity.json") -> tuple[dict[int, float], dict]:
    """The shipped ``bench_hops`` base's sampled success per hop count (bench testbed, seed 0) and
    where it comes from."""
    data = json.loads(path.read_text())
    sampled = data["measured"]["bench"]["0"]["sampled"]
    source = {"file": f"results/{path.name}", "setting": "bench", "seed": 0, "base_model": data["base_models"]["bench"]}
    return {h: sampled[str(h)] for h in (1, 2, 3)}, source


def explore_plan(values: list[float], seed: int) -> list[int]:
    """A quarter of stage 1 (one group of 8) on a uniformly drawn prompt, the rest exactly."""
    drawn = exploration_prompts(len(values), 8, 8, seed=seed)
    rest = [i for i in range(len(values)) if i not in drawn]
    counts = [8 if i in drawn else 0 for i in range(len(values))]
    for i, m in zip(rest, allocate_roots([values[i] for i in rest], 24, min_per_prompt=8), strict=True):
        counts[i] = m
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs=3, metavar=("ONE", "TWO", "THREE"),
                   help="Root values of 1-, 2- and 3-hop prompts (default: the shipped base's, measured).")
    p.add_argument("--out", type=Path, default=RESULTS / "stage1_replay.json")
    args = p.parse_args()
    if args.rates:
        rates, source = dict(zip((1, 2, 3), args.rates, strict=True)), {"given": "--rates"}
    else:
        rates, source = measured_rates()
    rng = random.Random(0)
    totals: dict[str, dict[int, int]] = {}
    for step in range(2000):
        pool = [rng.choice([1, 2, 3]) for _ in range(16)]
        v = [rates[h] for h in pool]
        plans = {
            "paper": allocate_roots(v, 32, min_per_prompt=8),
            "floor (m_min 2, stage 1 48)": allocate_roots(v, 48, min_per_prompt=8, floor_per_prompt=2),
            "coverage (chain's 8 prompts, >= 2)": allocate_roots(v[:8], 32, min_per_prompt=2, floor_per_prompt=2) + [0] * 8,
            "explore (1/4 of stage 1)": explore_plan(v, step),
        }
        for name, counts in plans.items():
            t = totals.setdefault(name, {1: 0, 2: 0, 3: 0})
            for h, m in zip(pool, counts, strict=True):
                t[h] += m
    shares = {name: {str(h): t[h] / sum(t.values()) for h in (1, 2, 3)} for name, t in totals.items()}
    for name, s in shares.items():
        print(f"{name:>36}: " + " / ".join(f"{100 * s[h]:.1f}%" for h in ("1", "2", "3")))
    write_json(args.out, {"rates": rates, "rates_from": source, "pools": 2000, "pool_size": 16,
                          "stage1_rollout_share_by_hops": shares})


if __name__ == "__main__":
    main()
