"""Tree savings: policy-generated tokens per leaf, tree schemes vs independent chains at equal leaves.

Issue 7 item 3. Every rollout (a chain or a branch continuation) ends in exactly one leaf, so at
the same budget of continuation rollouts every scheme produces the same number of leaves; what
differs is how many tokens the policy generates for them (a branch resumes from a stored prefix
and does not generate it again). Schemes, all on the same engine, policy (not trained: the
comparison is about sampling) and prompt pools, in a rotating order per step:

- ``chain``: ``group_size`` independent chains per prompt (GRPO's batch);
- ``tree_random``: Tree-GRPO style random expansion (the ``tree_grpo`` preset's scheme);
- ``trace``: TRACE allocation with its online success predictor (trained after every step on the
  step's trees, as in training; readiness scoring on, as in the ``trace`` preset);
- ``branch_deepest``: ``--roots`` chains per prompt, the remaining leaves branched from the
  deepest open boundaries (``rollout_throughput.branch_requests``), an upper bound on savings.

The setting is ``sample_efficiency.py``'s (same ``--set``/``--smoke``/hard options).

    python benchmarks/systems/tree_savings.py --quick   # 2 steps, budget 16: ~15 s on 2 cores
    python benchmarks/systems/tree_savings.py           # 10 steps, budget 32: ~2 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

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
    provenance_of,
    resolve,
    save_figure,
    setting_overrides,
    write_json,
)
from rollout_throughput import branch_requests
from sample_efficiency import BASE, QUICK

SCHEMES = ("chain", "tree_random", "trace", "branch_deepest")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 steps at budget 16.")
    p.add_argument("--steps", type=int, default=10, help="Prompt pools (training steps' worth of sampling).")
    p.add_argument("--roots", type=int, default=2, help="branch_deepest: chains per prompt before branching.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "tree_savings.json")
    add_config_args(p)
    args = p.parse_args()
    if args.quick:
        args.steps = 2
    return args


class DeepestBranching:
    """``roots`` chains per prompt, then the rest of ``group_size`` leaves from the deepest boundaries."""

    name = "branch_deepest"

    def __init__(self, group_size: int, roots: int) -> None:
        if not 1 <= roots <= group_size:
            raise ValueError(f"--roots must be in [1, group_size={group_size}], got {roots}")
        self.group_size, self.roots = group_size, roots

    def collect(self, executor: Any, pool: list, budget: int, generator: torch.Generator) -> Any:
        from tracerl.allocation.schemes import SchemeResult

        engine = executor.engine  # the trainer's LocalExecutor: this baseline drives the engine directly
        prompts = budget // self.group_size
        trees, cost = engine.rollout(pool[:prompts], [self.roots] * prompts, generator=generator)
        cost = cost + engine.expand(branch_requests(engine, trees, self.group_size - self.roots), generator=generator)
        return SchemeResult(trees=trees, cost=cost, effective_ratio=_effective_ratio(trees), consumed=prompts)


def _effective_ratio(trees: list) -> float:
    mixed = [len({t.reward > 0.5 for t in tree.trajectories.values() if not t.infra_failed}) > 1 for tree in trees]
    return sum(mixed) / len(mixed) if mixed else 0.0


def measure(args: argparse.Namespace, overrides: list[str]) -> tuple[dict[str, list[dict[str, Any]]], Any]:
    from tracerl.allocation.schemes import get_scheme
    from tracerl.train.data import take_pool
    from tracerl.train.loop import Trainer

    config = resolve("trace", overrides + [f"seed={args.seed}"], args.smoke)
    trainer = Trainer(config, fresh_dir(args.work_dir / "tree-savings"))
    cfg = config.rollout.schemes
    schemes = {"chain": get_scheme("chain", cfg), "tree_random": get_scheme("tree_random", cfg),
               "trace": trainer.scheme, "branch_deepest": DeepestBranching(cfg.group_size, args.roots)}
    engine, backend = trainer.executor.engine, trainer.executor.backend
    trainer.model.eval()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SCHEMES}
    for step in range(args.steps):
        pool = take_pool(trainer.data.train, step * config.rollout.pool_size, config.rollout.pool_size)
        for name in SCHEMES[step % len(SCHEMES):] + SCHEMES[: step % len(SCHEMES)]:
            before, clock = dict(backend.stats), time.perf_counter()
            generator = torch.Generator().manual_seed(args.seed * 100_003 + step)
            result = schemes[name].collect(trainer.executor, pool, config.rollout.budget, generator)
            seconds = time.perf_counter() - clock
            leaves = [t for tree in result.trees for t in tree.trajectories.values()]
            rows[name].append({
                "step": step, "leaves": len(leaves), "rollouts": result.cost.rollouts,
                "generated_tokens": result.cost.generated_tokens, "seconds": seconds,
                "prefill_tokens": backend.stats["prefill_tokens"] - before["prefill_tokens"],
                "turns": sum(len(t.turns) for t in leaves), "prompts": len(result.trees),
                "effective_ratio": result.effective_ratio,
            })
            if name == "trace" and trainer.predictor is not None:
                trainer.predictor.update(result.trees)  # online, as after a training step
            engine.forget(result.trees)
        print(f"step {step}: " + "  ".join(
            f"{n}={rows[n][-1]['generated_tokens'] / max(rows[n][-1]['leaves'], 1):.1f} tok/leaf" for n in SCHEMES),
            flush=True)
    return rows, config


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    schemes = {}
    for name, rs in rows.items():
        leaves = sum(r["leaves"] for r in rs)
        schemes[name] = {
            "leaves": leaves,
            "rollouts": sum(r["rollouts"] for r in rs),
            "generated_tokens_per_leaf": sum(r["generated_tokens"] for r in rs) / max(leaves, 1),
            "prefill_tokens_per_leaf": sum(r["prefill_tokens"] for r in rs) / max(leaves, 1),
            "turns_per_leaf": sum(r["turns"] for r in rs) / max(leaves, 1),
            "seconds_per_leaf": sum(r["seconds"] for r in rs) / max(leaves, 1),
            "effective_ratio_mean": mean([r["effective_ratio"] for r in rs]),
            "prompts_per_step": mean([r["prompts"] for r in rs]),
        }
    chain = schemes["chain"]["generated_tokens_per_leaf"]
    for s in schemes.values():
        s["saved_fraction_vs_chain"] = 1 - s["generated_tokens_per_leaf"] / chain if chain else None
    return {"schemes": schemes, "equal_leaves": len({s["leaves"] for s in schemes.values()}) == 1}


def plot(summary: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["schemes"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(names, [summary["schemes"][n]["generated_tokens_per_leaf"] for n in names], color="tab:blue")
    axes[0].set(ylabel="policy-generated tokens per leaf", title="Generated tokens per leaf (equal leaves)")
    axes[1].bar(names, [summary["schemes"][n]["seconds_per_leaf"] for n in names], color="tab:orange")
    axes[1].set(ylabel="seconds per leaf", title="Sampling wall time per leaf")
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
        ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, out)


def main() -> None:
    args = _args()
    configure_torch(args.threads)
    overrides = setting_overrides(args, BASE + (QUICK if args.quick else []))
    clock = time.perf_counter()
    rows, config = measure(args, overrides)
    summary = summarise(rows)
    result = {**summary, "setting": {"overrides": overrides, "smoke": args.smoke, **describe_config(config),
                                     "steps": args.steps, "roots": args.roots, "seed": args.seed},
              "steps": rows, "quick": args.quick, "seconds": time.perf_counter() - clock, **machine(),
              "provenance": provenance_of(config)}
    write_json(args.out, result)
    png = plot(summary, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    for name, s in summary["schemes"].items():
        print(f"{name:>15}: {s['generated_tokens_per_leaf']:.1f} tokens/leaf  saved {s['saved_fraction_vs_chain']:.3f}  "
              f"leaves {s['leaves']}  {1000 * s['seconds_per_leaf']:.1f} ms/leaf")


if __name__ == "__main__":
    main()
