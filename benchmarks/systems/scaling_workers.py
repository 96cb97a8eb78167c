"""Rollout workers: the same rollout work on 1 and 2 Ray workers (``rollout.executor = ray``).

Each step is what the trainer does around its executor: the ``trace`` scheme plans and runs a
step's trees (TRACE allocation, credit on: readiness scored on the workers), then new weights go
to every worker (``sync_weights`` of a model held by this driver). Every configuration runs the
same steps (same pool, seeds and budget; the trees are identical, ``tests/distributed``), after one
warm-up step. Measured per step: generated tokens per second (over the step), step time and its
shares: executing on the workers (start/expand/score calls), weight sync, planning (the scheme's
own time: predictor, allocation, request building, merging deltas) and the rest of the driver.
The trainer's update is left out: this is the rollout-worker half (``--nproc`` is the other).

From the 1-worker shares it predicts 8 workers on 8 GPUs by Amdahl's law: the execution share
divides by 8, sync and the driver's share stay (an upper bound on the speedup: it assumes the
workers split the trees evenly and that sync time does not grow with workers).

    PYTHONPATH=$PWD RAY_AUTH_MODE=disabled TRACERL_THREADS=1 .venv-ray/bin/python benchmarks/systems/scaling_workers.py

Writes ``benchmarks/results/scaling_workers.json``. Needs the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from helpers_tiny import bpe_tokenizer, tiny_model  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.allocation.schemes import get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402
from tracerl.config.schema import resolve_config  # noqa: E402
from tracerl.train.data import load_task_data  # noqa: E402
from tracerl.rollout.ray_executor import RayExecutor  # noqa: E402
from tracerl.testbed.provenance import provenance  # noqa: E402
from tracerl.train.executors import worker_spec  # noqa: E402

OVERRIDES = ["rollout.executor=ray", "rollout.readiness_on=workers", "rollout.budget=32", "rollout.pool_size=8"]


def measure(workers: int, steps: int, folder: Path) -> dict[str, float]:
    """Mean per-step numbers of ``steps`` steps (after one warm-up) on ``workers`` workers."""
    cfg = resolve_config("trace", smoke="random", overrides=OVERRIDES + [f"rollout.workers={workers}"])
    tasks = load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).train
    tok = bpe_tokenizer()
    trainer = tiny_model(len(tok), seed=3)  # the driver's copy of the policy (what sync_weights sends)
    executor = RayExecutor(worker_spec(cfg, folder))
    predictor = SuccessPredictor(cfg.predictor)
    scheme = get_scheme("trace", cfg.rollout.schemes, predictor, True)
    rows = []
    for step in range(steps + 1):
        clock = time.perf_counter()
        session = RolloutSession(executor, 100 + step, executor.version)
        pool = tasks[(step * cfg.rollout.pool_size) % len(tasks):][: cfg.rollout.pool_size]
        result = scheme.collect(session, pool, cfg.rollout.budget, torch.Generator().manual_seed(step))
        session.score(result.trees)
        planned = time.perf_counter() - clock
        executor.sync_weights(trainer, executor.version + 1)
        session.forget()
        seconds = time.perf_counter() - clock
        metrics = executor.take_metrics()
        execute = session.seconds["execute"] + session.seconds["score"]
        rows.append({"step_s": seconds, "tokens_per_s": result.cost.generated_tokens / seconds,
                     "share_execute": execute / seconds, "share_sync": metrics["time_sync_weights"] / seconds,
                     "share_planning": (planned - execute) / seconds,
                     "share_driver_other": (seconds - planned - metrics["time_sync_weights"]) / seconds,
                     "generated_tokens": result.cost.generated_tokens, "rollouts": result.cost.rollouts})
    executor.close()
    kept = rows[1:]
    return {key: sum(r[key] for r in kept) / len(kept) for key in kept[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scaling_workers.json"))
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        tok = bpe_tokenizer()
        tiny_model(len(tok), seed=3).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        runs = {f"workers_{n}": measure(n, args.steps, Path(tmp)) for n in (1, 2)}
    ray.shutdown()
    one = runs["workers_1"]
    serial = one["share_sync"] + one["share_planning"] + one["share_driver_other"]
    report = {
        "what": "trace scheme, credit on (readiness on the workers), smoke world, tiny random Qwen3; "
                f"budget 32, pool 8; mean of {args.steps} steps after one warm-up; sync of a driver-held model each step",
        "machine": {"cpu_cores": os.cpu_count(), "threads_per_process": os.environ.get("TRACERL_THREADS", ""),
                    "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__},
        "provenance": provenance(None),  # a random tiny Qwen3
        "runs": runs,
        "slowdown_2_vs_1": runs["workers_2"]["step_s"] / one["step_s"],
        "predicted_speedup_8_workers": 1.0 / (serial + one["share_execute"] / 8),
        "prediction": "Amdahl from the 1-worker shares: execution divides by 8, sync, planning and the rest of "
                      "the driver stay; an upper bound (even split of trees, sync not growing with workers). The trainer's "
                      "update is not in these steps (the --nproc half of benchmarks/systems/scaling.py measures it): with "
                      "it, the driver's share of a training step is larger and the speedup smaller",
    }
    tmp_out = Path(args.out).with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp_out, args.out)  # atomic: a killed run leaves the previous results
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
