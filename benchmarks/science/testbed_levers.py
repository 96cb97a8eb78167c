"""Measure one lever setting of the sample-efficiency testbed: base success per hop, then GRPO.

Issue 13 item 1. For a setting (``--set`` overrides on top of the sample-efficiency run knobs), it
records the initial model's success per hop count on the unseen world, sampled at the rollout
temperature (what GRPO's groups see) and greedy, then trains ``--method`` for ``--steps`` steps and
records greedy held-out accuracy per hop count along the way and at the end, with seconds per
step. Each call appends one row (keyed by ``--label``) to ``--out``; docs/results/setting.md's
"Choosing the setting" table is that file.

    python benchmarks/science/testbed_levers.py --label bench --set model.tiny_preset=bench \\
        --set data.world.distractors=0 --set data.search_top_k=3 --steps 150
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, configure_torch, fresh_dir, provenance_of, resolve, write_json
from sample_efficiency import by_hops

RUN = ["rollout.budget=64", "rollout.pool_size=16", "rollout.schemes.group_size=8", "eval.size=200",
       "log.checkpoint_every=1000000"]


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", required=True, help="Row name in --out (an existing row is replaced).")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=VALUE")
    p.add_argument("--method", default="grpo")
    p.add_argument("--steps", type=int, default=150, help="Training steps (0: base model only).")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--base-samples", type=int, default=2, help="Sampled episodes per held-out question at base.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/tracerl-levers"))
    p.add_argument("--out", type=Path, default=RESULTS / "testbed_levers.json")
    return p.parse_args()


def base_success(trainer: Any, samples: int, seed: int) -> dict[str, Any]:
    """Per-hop success of the initial policy on the evaluation questions: sampled at the rollout
    temperature (``samples`` episodes per question, as a group would) and greedy."""
    import torch

    from tracerl.rollout.evaluate import evaluate

    trainer.model.eval()
    tasks = trainer.data.held_out[: trainer.config.eval.size]
    with torch.no_grad():
        sampled = evaluate(trainer.executor.engine, tasks, samples=samples, generator=torch.Generator().manual_seed(seed))
    greedy = trainer.evaluate(trainer.data.held_out)
    return {"sampled": by_hops(sampled.metrics, "em_hops"), "sampled_all": sampled.metrics["em"],
            "sampled_turns": sampled.metrics["mean_turns"],
            "greedy": by_hops(greedy, "eval_accuracy_hops"), "greedy_all": greedy["eval_accuracy"]}


def main() -> None:
    from tracerl.train.loop import Trainer

    args = _args()
    configure_torch(args.threads)
    overrides = RUN + list(args.overrides) + [f"seed={args.seed}", f"steps={max(1, args.steps)}",
                                              f"eval.every={args.eval_every}"]
    config = resolve(args.method, overrides, False)
    trainer = Trainer(config, fresh_dir(args.work_dir / args.label))
    clock = time.perf_counter()
    base = base_success(trainer, args.base_samples, args.seed)
    base_seconds = time.perf_counter() - clock
    print(f"{args.label}: base {json.dumps(base)} ({base_seconds:.0f} s)", flush=True)
    row: dict[str, Any] = {"overrides": list(args.overrides), "method": args.method, "steps": args.steps,
                           "seed": args.seed, "eval_questions": config.eval.size, "base": base,
                           "base_seconds": base_seconds, "provenance": provenance_of(config)}
    if args.steps:
        clock = time.perf_counter()
        records = trainer.run()
        row["train_seconds"] = time.perf_counter() - clock
        row["step_seconds_mean"] = sum(r["step_seconds"] for r in records) / len(records)
        row["generated_tokens"] = records[-1]["total_generated_tokens"]
        row["curve"] = [{"step": r["step"], "accuracy": r["eval_accuracy"],
                         "by_hops": by_hops(r, "eval_accuracy_hops"), "turns": r.get("eval_turns")}
                        for r in records if r.get("eval_accuracy") is not None]
        row["final"] = row["curve"][-1]
        print(f"{args.label}: final {json.dumps(row['final'])} step {row['step_seconds_mean']:.2f} s", flush=True)
    table = json.loads(args.out.read_text()) if args.out.exists() else {"rows": {}}
    table["rows"][args.label] = row
    write_json(args.out, table)


if __name__ == "__main__":
    main()
