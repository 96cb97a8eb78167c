"""Where each method's rollouts go, per hop count, in the testbed (issue 13 item 2's reading).

In ``sample_efficiency_hops_pinned.json`` TRACE allocation keeps more mixed groups than GRPO but learns two- and
three-hop questions worse. This trains each method for ``--steps`` steps of the testbed
(``common.BENCH_SETTING``, the sweep's budget) with rollouts logged, and counts the leaves
(continuation rollouts) and trees per hop count of their questions: GRPO's share follows the prompt
pool, an allocation scheme's follows its predictor.

    python benchmarks/science/allocation_hop_share.py   # grpo and trace, 30 steps, seed 0: ~5 min of one core
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import BENCH_SETTING, RESULTS, configure_torch, fresh_dir, provenance_of, resolve, write_json
from sample_efficiency import BASE


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["grpo", "trace"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/tracerl-hop-share"))
    p.add_argument("--out", type=Path, default=RESULTS / "allocation_hop_share.json")
    return p.parse_args()


def hop_share(method: str, args: argparse.Namespace) -> dict:
    from tracerl.train.loop import Trainer

    overrides = BASE + BENCH_SETTING + ["eval.every=1000000", f"steps={args.steps}", "log.rollouts=true",
                                        f"seed={args.seed}"]
    out = fresh_dir(args.work_dir / method)
    trainer = Trainer(resolve(method, overrides, False), out)
    hops = {task.id: task.hops for task in trainer.data.train}
    trainer.run()
    leaves, trees = Counter(), Counter()
    for path in sorted((out / "rollouts").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                trees[str(hops[record["task_id"]])] += 1
                leaves[str(hops[record["task_id"]])] += len(record["trajectories"])
    total = sum(leaves.values())
    return {"leaf_share_by_hops": {h: leaves[h] / total for h in sorted(leaves)},
            "leaves_by_hops": dict(sorted(leaves.items())), "trees_by_hops": dict(sorted(trees.items()))}


def main() -> None:
    args = _args()
    configure_torch(args.threads)
    rows = {}
    for method in args.methods:
        rows[method] = hop_share(method, args)
        print(method, rows[method]["leaf_share_by_hops"], flush=True)
    write_json(args.out, {"steps": args.steps, "seed": args.seed, "setting": BENCH_SETTING, "methods": rows,
                          "provenance": provenance_of(resolve("grpo", BASE + BENCH_SETTING, False))})


if __name__ == "__main__":
    main()
