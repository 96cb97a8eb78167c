"""Kill-and-resume harness: SIGKILL a training process at random moments, resume, check nothing is lost.

Issue 14 item 3. One run of ``--steps`` steps is driven by ``tracerl train`` processes: each is
killed with SIGKILL after a random delay, and the next one continues the same folder, until
``--kills`` kills have landed; the last process then runs to the end. When a run finishes
before the kills are spent, the next run starts in a new folder. Each process is started as
the CLI documents:

- ``tracerl train grpo --smoke-random --out DIR ...`` when ``DIR/config.yaml`` does not exist yet
  (the process was killed before it wrote anything: a fresh start is allowed on a folder
  without run state);
- ``tracerl train --resume DIR --steps N`` otherwise (with no checkpoint yet it restarts the
  run from step 0; a fresh start on such a folder is refused, so nothing is silently reused).

Checks on every finished run: every step 1..N appears exactly once in ``metrics.jsonl``,
``LATEST`` names ``ckpt-N``, every process either was killed by us or exited 0 (resume always
succeeded), and the records equal those of an uninterrupted run of the same config (exact
resume; timings excluded). Kill moments come from the reference run's measured start-up and
per-step wall time: a quarter land during start-up (imports, ``initial/`` written, resume
truncating metrics), the rest uniformly over the steps still to run (rollouts, update, metrics
line, checkpoint write); what each kill left behind is tallied in ``aftermath``.

    python benchmarks/reliability/kill_resume.py --kills 50          # ~4-6 min on 2 busy cores
    python benchmarks/reliability/kill_resume.py --kills 6 --steps 8  # the CI subset (tests/train/test_kill_resume.py)

``--phases convert,view`` kills ``tracerl data convert`` and ``tracerl view`` instead (or as well:
``train,convert,view``) while they write their outputs; see benchmarks/reliability/kill_outputs.py:

    python benchmarks/reliability/kill_resume.py --phases convert,view --convert-kills 12 --view-kills 8 \
        --out benchmarks/results/kill_convert_view.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tracerl.runs.metrics import is_timing_key
from tracerl.testbed.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
# Cheap steps on the pretrained smoke model (it answers sometimes, so updates are non-zero);
# checkpoint_every=2 makes every other step one that is rerun after a kill.
OVERRIDES = ["data.verifier=answered", "rollout.budget=8", "rollout.pool_size=2",
             "rollout.engine.max_turns=3", "eval.size=2", "eval.every=0", "log.checkpoint_every=2",
             "optim.lr=1e-3"]


def _command(run_dir: Path, steps: int, model: str) -> list[str]:
    base = [sys.executable, "-m", "tracerl.cli", "train"]
    if (run_dir / "config.yaml").exists():
        return base + ["--resume", str(run_dir), "--steps", str(steps)]
    sets = [f"model.name_or_path={model}", *OVERRIDES]
    return base + ["grpo", "--smoke-random", "--out", str(run_dir), "--steps", str(steps)] + [
        arg for item in sets for arg in ("--set", item)]


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _launch(run_dir: Path, steps: int, model: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as handle:
        return subprocess.Popen(_command(run_dir, steps, model), cwd=ROOT, env=_env(), stdout=handle,
                                stderr=subprocess.STDOUT)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and line.endswith("}")]


def _aftermath(run_dir: Path, steps_per_run: int) -> str:
    """What a kill left behind, as one category (for the tally)."""
    if not (run_dir / "config.yaml").exists():
        return "before_config"
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size and not metrics.read_bytes().endswith(b"\n"):
        return "torn_metrics_line"
    if any(p.name.startswith(".") and ".tracerl-tmp-" in p.name for p in run_dir.iterdir()):
        return "temp_left"
    latest = run_dir / "LATEST"
    if not latest.exists():
        return "before_first_checkpoint"
    checkpoint = int(latest.read_text().strip()[len("ckpt-"):])
    steps = [r["step"] for r in _records(run_dir)]
    if checkpoint == steps_per_run:
        return "finished"
    return "lines_ahead_of_checkpoint" if steps and max(steps) > checkpoint else "at_checkpoint"


def _comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in records]


def check_run(run_dir: Path, steps: int, reference: list[dict[str, Any]] | None) -> list[str]:
    """Problems of a finished run (empty when it is intact)."""
    problems = []
    got = [r["step"] for r in _records(run_dir)]
    if got != list(range(1, steps + 1)):
        problems.append(f"{run_dir.name}: metrics steps {got}, expected 1..{steps} once each")
    latest = (run_dir / "LATEST").read_text().strip() if (run_dir / "LATEST").exists() else None
    if latest != f"ckpt-{steps:06d}":
        problems.append(f"{run_dir.name}: LATEST is {latest!r}")
    if reference is not None and _comparable(_records(run_dir)) != _comparable(reference):
        problems.append(f"{run_dir.name}: records differ from the uninterrupted run")
    return problems


def measure(work: Path, steps: int, model: str) -> tuple[list[dict[str, Any]], float, float]:
    """An uninterrupted reference run: its records, seconds until training starts (imports, data,
    model, ``initial/``) and wall seconds per step (rollout, update, metrics line, checkpoint)."""
    run_dir = work / "reference"
    shutil.rmtree(run_dir, ignore_errors=True)
    began = time.perf_counter()
    process = _launch(run_dir, steps, model, work / "reference.log")
    first = None
    while process.poll() is None:
        if first is None and _records(run_dir):
            first = time.perf_counter() - began
        time.sleep(0.01)
    if process.returncode != 0 or first is None:
        raise RuntimeError(f"reference run failed: see {work / 'reference.log'}")
    total = time.perf_counter() - began
    per_step = max((total - first) / max(steps - 1, 1), 0.01)
    return _records(run_dir), max(first - per_step, 0.1), per_step


def _delay(rng: random.Random, run_dir: Path, steps: int, ready_s: float, step_s: float) -> float:
    """A kill moment: a quarter during start-up (imports, initial/, resume truncation), the rest
    uniform over the steps still to run (rollout, update, metrics line, checkpoint write)."""
    done = max([r["step"] for r in _records(run_dir)], default=0)
    if rng.random() < 0.25:
        return rng.uniform(0.0, ready_s)
    return ready_s + rng.uniform(0.0, max(steps - done, 1) * step_s)


class _Pace:
    """Scales the measured timings to the machine's current speed (other jobs share the cores):
    a process that finished before its kill means the estimate was too long, a kill that landed
    means it was about right."""

    def __init__(self) -> None:
        self.scale = 1.0

    def finished_early(self) -> None:
        self.scale = max(self.scale * 0.8, 0.2)

    def killed(self) -> None:
        self.scale = min(self.scale * 1.03, 2.0)


def run_harness(work: Path, *, kills: int, steps: int, seed: int, model: str,
                compare: bool = True) -> dict[str, Any]:
    """Drive runs with ``kills`` random SIGKILLs; return the summary (``ok`` and ``problems``)."""
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    reference, ready_s, step_s = measure(work, steps, model)
    tally: dict[str, int] = {}
    problems: list[str] = []
    runs, landed, processes, pace = 0, 0, 0, _Pace()
    began = time.perf_counter()
    while landed < kills:
        runs += 1
        run_dir = work / f"run{runs:03d}"
        shutil.rmtree(run_dir, ignore_errors=True)
        while True:
            delay = pace.scale * _delay(rng, run_dir, steps, ready_s, step_s)
            process = _launch(run_dir, steps, model, work / f"run{runs:03d}.log")
            processes += 1
            try:
                code = process.wait(timeout=None if landed >= kills else delay)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                landed += 1
                pace.killed()
                kind = _aftermath(run_dir, steps)
                tally[kind] = tally.get(kind, 0) + 1
                if kind != "finished":
                    continue
                code = 0  # killed while exiting after its last checkpoint: the run is complete
            finally:
                if process.poll() is None:  # the harness itself was interrupted
                    process.kill()
            if landed < kills:
                pace.finished_early()
            if code != 0:
                problems.append(f"run{runs:03d}: a process exited {code} (see run{runs:03d}.log)")
            break
        problems += check_run(run_dir, steps, reference if compare else None)
    return {"ok": not problems, "problems": problems, "kills": landed, "runs": runs, "processes": processes,
            "final_pace_scale": round(pace.scale, 3),
            "steps_per_run": steps, "startup_s": round(ready_s, 3), "step_wall_s": round(step_s, 3),
            "seconds": round(time.perf_counter() - began, 1), "aftermath": dict(sorted(tally.items())),
            "seed": seed, "overrides": OVERRIDES}


def smoke_model() -> str:
    """The pretrained smoke tiny model's folder (pretrained once, cached), so processes never pretrain."""
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    return str(load_or_pretrain(get_preset("smoke")))


def _output_phases(args: argparse.Namespace, phases: list[str]) -> dict[str, Any]:
    """Kills during ``data convert`` and ``view`` (benchmarks/reliability/kill_outputs.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from kill_outputs import convert_kills, view_kills

    rng, out = random.Random(args.seed), {}
    if "convert" in phases:
        out["convert"] = convert_kills(args.work_dir / "convert", args.convert_kills, rng, _env())
    if "view" in phases:
        out["view"] = view_kills(args.work_dir / "view", args.view_kills, rng, _env(), smoke_model())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "kill_resume")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kill_resume.json")
    parser.add_argument("--phases", default="train", help="comma-separated: train, convert, view")
    parser.add_argument("--convert-kills", type=int, default=12)
    parser.add_argument("--view-kills", type=int, default=8)
    args = parser.parse_args()
    phases = args.phases.split(",")
    summary: dict[str, Any] = {}
    if "train" in phases:
        summary = run_harness(args.work_dir, kills=args.kills, steps=args.steps, seed=args.seed, model=smoke_model())
    summary.update(_output_phases(args, phases))
    summary["ok"] = all(summary[k]["ok"] for k in ("convert", "view") if k in summary) and summary.get("ok", True)
    train = f" --kills {args.kills} --steps {args.steps}" if "train" in phases else ""
    kills = "".join(f" --{p}-kills {getattr(args, p + '_kills')}" for p in ("convert", "view") if p in phases)
    summary["command"] = f"python benchmarks/reliability/kill_resume.py{train} --seed {args.seed} --phases {args.phases}{kills}"
    summary["provenance"] = provenance("tiny", "smoke")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
