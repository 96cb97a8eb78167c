"""verl's own trainer with TRACE on the CPU, measured: what one live run shows and what it costs.

Runs ``examples/verl/cpu/{prepare.py,run.sh}`` for 3 steps (10 leaves a step, verl pads to 12,
a validation first, a checkpoint each step) while sampling the machine's used memory, then runs
TRACE steps of the same shape through tracerl's own in-process HF executor on the same model,
config, seeds and budget (no verl, no Ray; the train file's questions in order, where verl's loader
shuffles), and records side by side:

* per step, from verl's console metrics: ``tracerl/advantage_max_abs_diff`` (every leaf's
  advantage in verl against tracerl's ``trace_credit`` on the manager's trees; padding rows
  against 0), ``tracerl/trained_leaves`` and ``tracerl/padding_rows``, the manager's rollout
  seconds and generated tokens;
* rollout tokens per second inside verl (the manager's TRACE step: planning, the servers behind
  verl's client and router, readiness) against tracerl's own executor doing the same step;
* the run's wall time and the machine's peak used memory above its idle level.

    HF_HUB_OFFLINE=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 .venv-verl/bin/python benchmarks/systems/verl_cpu_e2e.py

Writes ``benchmarks/results/verl_cpu_e2e.json``. Needs the ``verl`` extra. Run it alone: the
machine's memory is measured, not one process's.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verl" / "cpu"
sys.path.insert(0, str(ROOT / "tests" / "integrations"))

from test_verl_main_ppo import example_env, steps  # noqa: E402  (what the end-to-end test runs with)

STEPS = 3


def used_memory_gb() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kb = lambda key: int(info[key].split()[0])  # noqa: E731
    return (kb("MemTotal") - kb("MemAvailable")) / 2**20


def verl_run(out: Path, env: dict[str, str]) -> tuple[dict[int, dict[str, float]], float, float, float]:
    """verl's metrics per step, the run's seconds, idle and peak used memory (GB)."""
    idle, peak, done = used_memory_gb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], used_memory_gb())
            time.sleep(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    run = subprocess.run(["bash", str(EXAMPLE / "run.sh"), str(out), f"trainer.total_training_steps={STEPS}"],
                         env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    if run.returncode != 0:
        sys.exit(run.stderr[-4000:])
    return steps(run.stdout + run.stderr), seconds, idle, peak[0]


def tracerl_run(out: Path) -> list[dict[str, float]]:
    """The manager's TRACE steps through tracerl's own in-process HF executor (no verl, no Ray)."""
    import pandas as pd
    from omegaconf import OmegaConf

    from tracerl.allocation.session import RolloutSession
    from tracerl.core.seeds import derive_seed
    from tracerl.core.types import Task
    from tracerl.integrations.verl.manager import build_parts
    from tracerl.models.backend import HFPolicy
    from tracerl.rollout.engine import RolloutEngine
    from tracerl.rollout.executor import LocalExecutor

    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(out / "model")}},
                               "tracerl": {"preset": "trace", "config_file": str(out / "tracerl.yaml")}})
    parts = build_parts(config)
    policy = HFPolicy(parts.reference.model, parts.tokenizer)
    executor = LocalExecutor(RolloutEngine(policy, parts.environment, parts.fmt, parts.verifier, parts.engine),
                             parts.reference.score_nodes)
    frame = pd.read_parquet(out / "data" / "train.parquet")
    tasks = [Task(id=f"t{i}", question=row["extra_info"]["question"], answers=tuple(row["reward_model"]["ground_truth"]))
             for i, row in frame.iterrows()]
    out_steps = []
    for step in range(1, STEPS + 1):
        pool = tasks[(step - 1) * 4: step * 4]  # verl's loader: train_batch_size = 4 prompts a step
        session = RolloutSession(executor, seed=derive_seed(parts.seed, "verl_step", step), version=0)
        start = time.perf_counter()
        result = parts.scheme.collect(session, pool, parts.budget)
        session.score(result.trees)
        seconds = time.perf_counter() - start
        # every node's turn was generated once (its branches share it), as the servers count tokens
        generated = sum(len(n.turn.assistant_ids) for tree in result.trees for n in tree.nodes if n.turn is not None)
        if parts.predictor is not None:
            parts.predictor.update(result.trees)
        session.forget()
        out_steps.append({"rollout_seconds": seconds, "leaves": float(result.cost.rollouts),
                          "generated_tokens": float(generated)})
    return out_steps


def main() -> None:
    import torch

    from tracerl.testbed.provenance import provenance

    base = Path(tempfile.mkdtemp(prefix="verl_cpu_e2e_"))
    env = example_env(base / "cache")
    subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), str(base / "run")], env=env, check=True)
    metrics, seconds, idle, peak = verl_run(base / "run", env)
    os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
    torch.set_num_threads(1)  # the manager's setting (model.threads = 1) and the server's
    own = tracerl_run(base / "run")
    per_step = []
    for step in range(1, STEPS + 1):
        m = metrics[step]
        per_step.append({
            "step": step,
            "advantage_max_abs_diff": m["tracerl/advantage_max_abs_diff"],
            "advantage_max_abs": m["tracerl/advantage_max_abs"],
            "trained_leaves": m["tracerl/trained_leaves"], "padding_rows": m["tracerl/padding_rows"],
            "verl_rollout_seconds": m["tracerl/rollout_seconds"], "verl_generated_tokens": m["tracerl/generated_tokens"],
            "verl_rollout_tokens_per_s": m["tracerl/rollout_tokens_per_s"],
            "own_rollout_seconds": own[step - 1]["rollout_seconds"],
            "own_generated_tokens": own[step - 1]["generated_tokens"],
            "reward_mean": m.get("critic/score/mean"), "pg_loss": m.get("actor/pg_loss"),
        })
    verl_rate = sum(s["verl_generated_tokens"] for s in per_step) / sum(s["verl_rollout_seconds"] for s in per_step)
    own_rate = sum(s["own_generated_tokens"] for s in per_step) / sum(s["own_rollout_seconds"] for s in per_step)
    result = {
        "what": "verl 0.9.1 main_ppo + TRACE on the CPU (examples/verl/cpu), 3 steps, against tracerl's own HF executor",
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "provenance": provenance(str(base / "run" / "model")),  # the model prepare.py wrote
        "steps": per_step,
        "verl_run_seconds": round(seconds, 1),
        "memory_gb": {"idle": round(idle, 2), "peak": round(peak, 2), "peak_above_idle": round(peak - idle, 2)},
        "rollout_tokens_per_s": {"inside_verl": round(verl_rate, 1), "tracerl_own_hf_executor": round(own_rate, 1),
                                 "ratio_verl_over_own": round(verl_rate / own_rate, 3)},
        "note": "tokens per second over the manager's TRACE step (planning, sampling, readiness). Inside verl: generation on tracerl_hf server actors behind verl's client and router, readiness on verl's reference worker (a TransferQueue round trip and a worker call per scoring round); own executor: in-process HF generation and in-process readiness. On a 0.08M-parameter model per-call overhead dominates, so the ratio says nothing about large models on GPUs. verl's loader shuffles, so the two sides sample different questions; the own executor keeps the initial weights while verl trains",
    }
    path = ROOT / "benchmarks" / "results" / "verl_cpu_e2e.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
