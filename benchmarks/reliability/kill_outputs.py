"""SIGKILLs during ``tracerl data convert`` and ``tracerl view`` (the output-writing commands).

Called by ``benchmarks/reliability/kill_resume.py --phases convert,view``. Each kill lands at a random moment
of the command's write phase (after its first temporary file appears); then:

- ``convert``: the output folder first holds a good conversion A (a small raw file); the killed
  process converts a larger file B into it. After the kill, reading the folder (``load_tasks``,
  ``load_corpus``: what env-check and training read) must give exactly A or exactly B, or be
  refused in one line (``converting``: an interrupted set); a cut file that loads is the failure
  this guards against. A rerun to completion must then give B with no temporaries left.
- ``view``: after the kill every page present is complete (ends with ``</html>``); a rerun must
  leave no temporaries in ``view/`` (the view cleans up after a killed one).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MUSIQUE = ROOT / "tests" / "data" / "raw" / "musique_dev_sample.jsonl"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracerl.cli", *args]


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tracerl-tmp-" in p.name) if folder.is_dir() else []


def _kill_in_write_phase(command: list[str], folder: Path, env: dict[str, str], rng: random.Random,
                         window_s: float, log: Path) -> bool:
    """Start ``command``, wait for its first temporary in ``folder``, SIGKILL it a random moment later.

    Returns whether the kill landed (False: it exited first)."""
    with open(log, "ab") as handle:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    try:
        while process.poll() is None and not _temps(folder):
            time.sleep(0.002)
        if process.poll() is not None:
            return False
        time.sleep(rng.uniform(0.0, window_s))
        if process.poll() is not None:
            return False
        process.send_signal(signal.SIGKILL)
        process.wait()
        return True
    finally:
        if process.poll() is None:
            process.kill()


def _write_phase(command: list[str], folder: Path, env: dict[str, str]) -> float:
    """Seconds from ``command``'s first temporary in ``folder`` to its exit (an uninterrupted run)."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None and not _temps(folder):
        time.sleep(0.002)
    began = time.perf_counter()
    if process.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} failed")
    return max(time.perf_counter() - began, 0.005)


def _raw_file(path: Path, copies: int) -> Path:
    """MuSiQue rows repeated ``copies`` times under new ids (the paragraphs repeat, the tasks do not)."""
    rows = [json.loads(line) for line in MUSIQUE.read_text().splitlines() if line.strip()]
    with open(path, "w") as handle:
        for copy in range(copies):
            for row in rows:
                handle.write(json.dumps({**row, "id": f"{row['id']}-{copy}"}) + "\n")
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in ("tasks.jsonl", "corpus.jsonl") if (folder / name).exists()}


def _read_state(folder: Path) -> tuple[str, dict[str, bytes]]:
    """``("loaded", files)`` when readers accept the folder, ``("refused", {})`` when they refuse it."""
    from tracerl.envs.data import load_corpus, load_tasks
    from tracerl.errors import UserError

    try:
        load_tasks(folder / "tasks.jsonl")
        load_corpus(folder / "corpus.jsonl")
    except UserError:
        return "refused", {}
    return "loaded", _snapshot(folder)


def convert_kills(work: Path, kills: int, rng: random.Random, env: dict[str, str]) -> dict[str, Any]:
    """Kill ``data convert`` ``kills`` times over a good previous output (see module doc)."""
    work.mkdir(parents=True, exist_ok=True)
    small, big = _raw_file(work / "small.jsonl", 1), _raw_file(work / "big.jsonl", 60)
    ref_b = work / "ref-b"
    shutil.rmtree(ref_b, ignore_errors=True)
    ref_b.mkdir()
    window = _write_phase(_cli("data", "convert", "musique", "--input", str(big), "--out", str(ref_b)), ref_b, env)
    new = _snapshot(ref_b)
    tally: dict[str, int] = {}
    problems: list[str] = []
    landed = attempts = 0
    while landed < kills and attempts < kills * 3:
        attempts += 1
        out = work / f"out{attempts:03d}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(_cli("data", "convert", "musique", "--input", str(small), "--out", str(out)), cwd=ROOT,
                       env=env, check=True, capture_output=True)
        old = _snapshot(out)
        command = _cli("data", "convert", "musique", "--input", str(big), "--out", str(out))
        if not _kill_in_write_phase(command, out, env, rng, window, work / "convert.log"):
            continue
        landed += 1
        state, files = _read_state(out)
        kind = "refused_interrupted" if state == "refused" else "old" if files == old else "new" if files == new else "TORN"
        tally[kind] = tally.get(kind, 0) + 1
        if kind == "TORN":
            problems.append(f"{out.name}: a torn conversion was accepted by the readers")
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
        if _read_state(out) != ("loaded", new) or _temps(out):
            problems.append(f"{out.name}: the rerun did not give the new output cleanly ({_temps(out)})")
    return {"ok": not problems and landed == kills, "problems": problems, "kills": landed,
            "attempts": attempts, "aftermath": dict(sorted(tally.items())),
            "raw_rows": sum(1 for _ in open(big)), "write_phase_s": round(window, 3)}


def view_kills(work: Path, kills: int, rng: random.Random, env: dict[str, str], model: str) -> dict[str, Any]:
    """Kill ``tracerl view`` ``kills`` times on a 4-step run (see module doc)."""
    run = work / "run"
    if not (run / "LATEST").exists():
        shutil.rmtree(run, ignore_errors=True)
        subprocess.run(_cli("train", "grpo", "--smoke-random", "--steps", "4", "--out", str(run), "--set",
                            f"model.name_or_path={model}", "--set", "eval.size=2", "--set",
                            "rollout.engine.max_turns=2"), cwd=ROOT, env=env, check=True, capture_output=True)
    view = run / "view"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir()
    window = _write_phase(_cli("view", str(run)), view, env)
    tally: dict[str, int] = {}
    problems: list[str] = []
    landed = attempts = 0
    while landed < kills and attempts < kills * 3:
        attempts += 1
        shutil.rmtree(view, ignore_errors=True)
        view.mkdir()
        if not _kill_in_write_phase(_cli("view", str(run)), view, env, rng, window, work / "view.log"):
            continue
        landed += 1
        left = _temps(view)
        tally["temps_left_by_the_kill" if left else "no_temps_left"] = tally.get(
            "temps_left_by_the_kill" if left else "no_temps_left", 0) + 1
        torn = [p.name for p in view.glob("*.html") if not p.read_text().rstrip().endswith("</html>")]
        if torn:
            problems.append(f"kill {landed}: torn pages {torn}")
        subprocess.run(_cli("view", str(run)), cwd=ROOT, env=env, check=True, capture_output=True)
        if _temps(view):
            problems.append(f"kill {landed}: temporaries {_temps(view)} still there after a rerun")
    return {"ok": not problems and landed == kills, "problems": problems, "kills": landed, "attempts": attempts,
            "aftermath": dict(sorted(tally.items())), "write_phase_s": round(window, 3)}
