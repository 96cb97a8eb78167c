"""Scaling: the same smoke run with ``--nproc 1`` and ``--nproc 2`` (FSDP2 training processes).

Each process count trains the same ``grpo --smoke`` run (same seed, the smoke-pretrained tiny
model) through the CLI, so ``--nproc 2`` goes through torchrun like a user's run. From each
run's ``metrics.jsonl`` (step 1 dropped: warm-up): step time, the update's time and its share of
the step, generated tokens per second. The update phase at ``--nproc 2`` includes planning the
micro-batches, scattering the shares and gathering the new weights into rank 0's copy.

    python benchmarks/systems/scaling.py                 # nproc 1 and 2, 6 steps each: ~2 min on 2 cores
    python benchmarks/systems/scaling.py --steps 4 --nproc 1 2 4

On a 2-core CPU machine two processes share the cores the one process had, so a slowdown is
expected; what carries over to GPUs is the share of the step each phase takes.

The rollout-worker half (benchmarks/systems/scaling_sync.py; Ray: run it with .venv-dist): weight sync to
2 Ray workers as a float32 and as a bf16 policy (``sync_bytes``, bytes per parameter, seconds per
GB, the driver's peak memory above its level before the sync) and the placement imbalance
(busiest worker / mean) of 8 workers for 16 and 64 prompts, hash against least-loaded.

    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/systems/scaling.py --parts sync placement   # ~2 min; keeps the nproc runs

(the fixed malloc threshold makes glibc return freed large blocks, so the heap peak is the sync's own)

The ``memory`` part (benchmarks/systems/scaling_memory.py): each rank's peak memory while it builds its
sharded policy and frozen reference, loading the whole model first against reading its shard
only, for a 41M-parameter model:

    python benchmarks/systems/scaling.py --parts memory --nproc 1 2     # ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, fresh_dir, machine, mean, write_json
from scaling_memory import measure as memory_per_rank
from scaling_memory import measure_training
from scaling_sync import placement, weight_sync

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["grpo", "--smoke-random", "--set", "model.name_or_path=tiny", "--set", "model.tiny_preset=smoke",
         "--set", "data.verifier=answered", "--set", "eval.every=0", "--set", "eval.size=4",
         "--set", "log.checkpoint_every=1000"]


def run_once(nproc: int, steps: int, work: Path) -> dict[str, Any]:
    """Train ``steps`` steps at ``nproc`` processes; per-step means from step 2 on."""
    out = fresh_dir(work / f"nproc{nproc}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRACERL_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "tracerl.cli", "train", *SMOKE, "--steps", str(steps), "--out", str(out / "run"),
           "--nproc", str(nproc)]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    step = mean([r["step_seconds"] for r in records])
    update = mean([r["time_update"] for r in records])
    return {
        "nproc": nproc,
        "steps_measured": len(records),
        "step_seconds": step,
        "update_seconds": update,
        "update_share": (update / step) if step and update is not None else None,
        "rollout_share": mean([r["time_rollout"] / r["step_seconds"] for r in records]),
        "generated_tokens_per_s": mean([r["generated_tokens_per_s"] for r in records]),
        "losses": [r["loss"] for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=str(RESULTS / "scaling.json"))
    parser.add_argument("--parts", nargs="+", choices=["nproc", "sync", "placement", "memory", "training_memory"],
                        default=["nproc", "sync", "placement", "memory"],
                        help="what to measure (the file keeps the rest)")
    args = parser.parse_args()
    out = Path(args.out)
    report: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    report["machine"] = machine()
    if "nproc" in args.parts:
        work = fresh_dir(Path(os.environ.get("TMPDIR", "/tmp")) / "tracerl-scaling")
        runs = [run_once(n, args.steps, work) for n in args.nproc]
        base = runs[0]["step_seconds"]
        for r in runs:
            r["step_time_over_first"] = (r["step_seconds"] / base) if base else None
        report.update({"setting": "grpo --smoke, tiny smoke model, gloo on CPU", "steps": args.steps, "runs": runs})
        for r in runs:
            print(f"nproc {r['nproc']}: step {r['step_seconds']:.3f} s, update {r['update_seconds']:.3f} s "
                  f"({100 * r['update_share']:.0f}%), x{r['step_time_over_first']:.2f}")
    if "placement" in args.parts:
        report["placement"] = placement()
        for key, row in report["placement"].items():
            if isinstance(row, dict):
                print(f"placement {key}: busiest/mean hash {row['hash_mean']:.2f} (max {row['hash_max']:.2f}), "
                      f"least-loaded {row['balanced_mean']:.2f} (max {row['balanced_max']:.2f})")
    if "memory" in args.parts:
        work = fresh_dir(Path(os.environ.get("TMPDIR", "/tmp")) / "tracerl-scaling-memory")
        report["memory_per_rank"] = memory = memory_per_rank(args.nproc, work)
        for row in memory["runs"]:
            print(f"memory nproc {row['nproc']} {row['mode']}: peak per rank +{row['max_peak_bytes'] / 1e6:.0f} MB "
                  f"({row['max_peak_over_model']:.2f}x the float32 model)")
    if "training_memory" in args.parts:  # Ray: run with .venv-dist
        work = fresh_dir(Path(os.environ.get("TMPDIR", "/tmp")) / "tracerl-scaling-training-memory")
        report["training_memory_per_rank"] = train = measure_training(work)
        for name, row in train["runs"].items():
            mb = {r: round(b / 1e6) for r, b in row["training_private_bytes"].items()}
            shared = {r: round(b / 1e6) for r, b in row["training_shared_bytes"].items()}
            print(f"training memory {name}: private MB per rank while training {mb} (shared {shared}), rank 0 - "
                  f"rank 1 = {row['rank0_minus_rank1_private_over_model']:.2f}x the float32 model")
    if "sync" in args.parts:
        report["weight_sync"] = sync = weight_sync()
        for name in ("float32", "bfloat16", "bfloat16_one_bucket"):
            row = sync[name]
            print(f"sync {name}: {row['sync_bytes'] / 1e6:.1f} MB ({row['bytes_per_parameter']:.0f} B/param), "
                  f"{row['seconds']:.2f} s, {row['s_per_gb']:.2f} s/GB, driver peak heap +"
                  f"{row['driver_heap_peak_above_before_bytes'] / 1e6:.0f} MB, shared memory +"
                  f"{row['driver_shmem_peak_above_before_bytes'] / 1e6:.0f} MB")
    write_json(out, report)


if __name__ == "__main__":
    main()
