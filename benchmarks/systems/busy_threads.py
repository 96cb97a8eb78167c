"""Demo training steps beside a busy process: torch thread counts and the OpenMP wait policy.

Issue 51 item 14: beside one busy process on 2 cores the demo's steps took 60-80 s instead of
1.5-7 s. Each configuration runs in a fresh process (``OMP_WAIT_POLICY`` is read when torch
starts OpenMP), builds the demo's trainer (``tracerl.train.demo.demo_config``, the shipped tiny
model) in a temporary folder, takes one warm-up step and then times ``--steps`` steps. The
configurations take turns, round by round, so load from other processes hits each alike; the
``busy`` condition runs them beside one process of this benchmark's own that spins on a core.

Configurations: ``threads2`` (torch's default on 2 cores, active waiting), ``threads2_passive``
(``OMP_WAIT_POLICY=PASSIVE``, what the demo does), ``threads1``, ``auto`` (threads for the cores
found free at start, ``tracerl.busy_cores.free_cores``, and passive waiting).

    python benchmarks/systems/busy_threads.py --rounds 1 --steps 2   # ~5-15 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
CONFIGS: dict[str, dict[str, str]] = {
    "threads2": {"TRACERL_THREADS": "2", "OMP_WAIT_POLICY": ""},
    "threads2_passive": {"TRACERL_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "threads1": {"TRACERL_THREADS": "1", "OMP_WAIT_POLICY": ""},
    "auto": {"TRACERL_THREADS": "", "OMP_WAIT_POLICY": "", "AUTO": "1"},
}

CHILD = r"""
import json, os, sys, tempfile, time
from pathlib import Path
from tracerl.busy_cores import free_cores, passive_wait
if os.environ.get("AUTO"):
    passive_wait()
    os.environ["TRACERL_THREADS"] = str(free_cores() or 1)
import torch
from tracerl.train.demo import demo_config
from tracerl.train.loop import Trainer
steps = int(sys.argv[1])
config = demo_config()
config.eval.every = 0
with tempfile.TemporaryDirectory() as tmp, Trainer(config, Path(tmp) / "run") as trainer:
    trainer.step()  # warm-up: first-call allocations, the predictor's first fit
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - start)
print(json.dumps({"threads": torch.get_num_threads(), "step_s": times,
                  "wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}))
"""


def run_config(name: str, steps: int, timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "TRACERL_THREADS", "OMP_NUM_THREADS")}
    env.update({k: v for k, v in CONFIGS[name].items() if v})
    env.setdefault("HF_HUB_OFFLINE", "1")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=env, capture_output=True, text=True,
                              timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return {"config": name, "timed_out_s": timeout, "load1_before": load}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"config": name, **result, "median_step_s": statistics.median(result["step_s"]),
            "wall_s": time.perf_counter() - start, "load1_before": load}


def spinner() -> subprocess.Popen[bytes]:
    """One process that keeps a core busy (the 'one other busy process' of the issue)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    from tracerl.testbed.provenance import git_state  # the commit measured (issue 48)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--conditions", nargs="+", default=["busy", "idle"], choices=["busy", "idle"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration run")
    parser.add_argument("--out", default=str(RESULTS / "busy_threads.json"))
    args = parser.parse_args()
    runs = []
    for condition in args.conditions:
        for index in range(args.rounds):
            order = args.configs[index % len(args.configs):] + args.configs[:index % len(args.configs)]
            busy = spinner() if condition == "busy" else None
            try:
                for name in order:
                    run = {"condition": condition, "round": index, **run_config(name, args.steps, args.timeout)}
                    print(json.dumps(run), flush=True)
                    runs.append(run)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    summary = {}
    for c in args.conditions:
        for n in args.configs:
            times = [s for r in runs if r["condition"] == c and r["config"] == n for s in r.get("step_s", [])]
            summary[f"{c}/{n}"] = statistics.median(times) if times else None  # None: every run timed out
    out = {"benchmark": "busy_threads", "machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                                                     "python": platform.python_version()},
           "steps_per_run": args.steps, "median_step_s": summary, "runs": runs,
           "note": "the machine was shared with other work; load1_before is the 1-minute load average at each start",
           "git": git_state()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=Path(args.out).parent, delete=False, suffix=".tmp") as handle:
        handle.write(json.dumps(out, indent=2) + "\n")
    os.replace(handle.name, args.out)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
