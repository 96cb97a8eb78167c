"""Issue 50's cases on files: temporaries, atomic outputs, a failed start, pickles, config anchors,
lone surrogates and pointers, for hostile_inputs.py.

Each entry of :data:`ROUND4_FILES` is ``(name, owner, build, options)``, as in
hostile_round4_bounds.py: hostile_inputs.py wraps them in its ``Case`` and judges them like its own
(one line on stderr or a clean exit with the case's check, nothing outside touched, the memory
bound, the timeout). ``build(work, run)`` returns the CLI arguments (``--script FILE`` runs a file).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUN_ARGS = ["--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"]
SMOKE = ["--smoke-random", "--steps", "1", *RUN_ARGS]
USER_FILES = {".backup.tmp-1/d": b"x", f".ed.tmp-{os.getpid()}": b"y",  # the probe's own pid: alive
              ".thesis.tmp-999999/chapter1.tex": b"chapter", ".notes.txt.tmp-4000000": b"notes",
              ".x.tmp-99999999999999999999": b"past any pid"}
"""A user's files whose names look like other programs' temporaries (items 1, 2, 14)."""


def _plant(folder: Path) -> None:
    for name, content in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)


def _kept(folder: Path) -> str | None:
    lost = [name for name, content in USER_FILES.items()
            if not (folder / name).is_file() or (folder / name).read_bytes() != content]
    return f"the user's {', '.join(lost)} deleted or changed" if lost else None


def train_user_temps(work: Path, run: Path) -> list[str]:
    _plant(work / "P")
    return ["train", "grpo", *SMOKE, "--out", str(work / "P")]


def _train_kept(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    return f"exit {done.returncode}" if done.returncode else _kept(work / "P")


def view_out_user_temps(work: Path, run: Path) -> list[str]:
    _plant(work / "U")
    return ["view", str(run), "--out", str(work / "U")]


def _view_kept(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    return f"exit {done.returncode}" if done.returncode else _kept(work / "U")


def view_pid_overflow(work: Path, run: Path) -> list[str]:
    (run / "view").mkdir(exist_ok=True)
    (run / "view" / ".x.tmp-99999999999999999999").write_bytes(b"x")
    return ["view", str(run)]


def _overflow_kept(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode:
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    return None if (work / "run" / "view" / ".x.tmp-99999999999999999999").is_file() else "the file was deleted"


EARLIER = b'{"earlier": "content"}\n' * 100


def eval_out_full_disk(work: Path, run: Path) -> list[str]:
    """A disk that takes no file past 4,096 bytes (``RLIMIT_FSIZE``: EFBIG, as ENOSPC would fail)."""
    (work / "F.jsonl").write_bytes(EARLIER)
    args = ["eval", "--run", str(run), "--samples", "8", "--temperature", "1", "--limit", "2", "--no-progress",
            "--out", str(work / "F.jsonl")]
    (work / "exercise.py").write_text(
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        f"sys.argv = ['tracerl', *{args!r}]\n"
        "from tracerl.cli import app\napp()\n")
    return ["--script", "exercise.py"]


def _earlier_whole(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    if (work / "F.jsonl").read_bytes() != EARLIER:
        return f"F.jsonl's earlier content replaced ({(work / 'F.jsonl').stat().st_size} bytes)"
    left = [p.name for p in work.iterdir() if p.name.startswith(".F.jsonl")]
    return f"temporaries left: {left}" if left else None


def max_total_tokens_1(work: Path, run: Path) -> list[str]:
    return ["train", "grpo", *SMOKE, "--set", "rollout.engine.max_total_tokens=1", "--out", str(work / "new-run")]


def _no_run_folder(work: Path, done: subprocess.CompletedProcess[str]) -> str | None:
    """A failed start leaves no run state (the corrected command then starts in the same folder)."""
    return "the run folder was left" if (work / "new-run").exists() else None


RECURSIVE = "optim: &o {self: *o}\n"


def yaml_recursive(*command: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        (work / "rec.yaml").write_text(RECURSIVE)
        return [*command, "--config", str(work / "rec.yaml")]
    return build


SURROGATE_TASKS = '{"id": "1", "question": "Who \\ud800 wrote it?", "answers": ["Varo"]}\n'
DOC = '{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n'


def surrogate_question(command: str) -> Callable[[Path, Path], list[str]]:
    def build(work: Path, run: Path) -> list[str]:
        (work / "tasks.jsonl").write_text(SURROGATE_TASKS)
        (work / "corpus.jsonl").write_text(DOC)
        if command == "env-check":
            return ["env-check", "--tasks", str(work / "tasks.jsonl"), "--corpus", str(work / "corpus.jsonl")]
        return ["train", "grpo", *SMOKE, "--set", f"data.tasks={work / 'tasks.jsonl'}",
                "--set", f"data.corpus={work / 'corpus.jsonl'}", "--out", str(work / "new-run")]
    return build


def view_surrogate_record(work: Path, run: Path) -> list[str]:
    path = sorted((run / "rollouts").glob("step-*.jsonl.gz"))[0]
    text = gzip.decompress(path.read_bytes()).decode()
    path.write_bytes(gzip.compress(text.replace('"question":"', '"question":"\\ud800', 1).encode()))
    return ["view", str(run)]


def latest_arabic_digits(work: Path, run: Path) -> list[str]:
    name = "ckpt-" + "\u0660" * 5 + "\u0661"
    (run / "ckpt-000001").rename(run / name)
    (run / "LATEST").write_text(name)
    return ["train", "--resume", str(run), "--steps", "2"]


def verl_predictor_pickle(work: Path, run: Path) -> list[str]:
    """A verl checkpoint's ``tracerl_predictor.pt`` that would run ``touch outside/ran`` when unpickled."""
    (work / "make.py").write_text(
        "import os, sys, torch\n"
        "class P:\n    def __reduce__(self):\n"
        f"        return (os.system, ('touch {work / 'outside' / 'ran'}',))\n"
        "torch.save({'w': torch.ones(1), 'p': P()}, sys.argv[1])\n")
    (work / "global_step_3").mkdir()
    subprocess.run([sys.executable, str(work / "make.py"), str(work / "global_step_3" / "tracerl_predictor.pt")],
                   check=True, cwd=work)
    (work / "exercise.py").write_text(
        "import sys\nfrom tracerl.errors import UserError\n"
        "from tracerl.integrations.verl.predictor_io import load_predictor_state\n"
        f"try:\n    load_predictor_state({str(work / 'global_step_3')!r})\n"
        "except UserError as err:\n    sys.stderr.write(str(err) + '\\n')\n    sys.exit(1)\n")
    return ["--script", "exercise.py"]


ROUND4_FILES: list[tuple[str, str, Callable[[Path, Path], list[str]], dict[str, Any]]] = [
    ("train_user_temps", "files", train_user_temps, {"expect_ok": True, "check": _train_kept, "needs_run": False}),
    ("view_out_user_temps", "files", view_out_user_temps, {"expect_ok": True, "check": _view_kept}),
    ("view_pid_overflow", "files", view_pid_overflow, {"expect_ok": True, "check": _overflow_kept}),
    ("eval_out_full_disk", "files", eval_out_full_disk, {"check": _earlier_whole}),
    ("max_total_tokens_1", "files", max_total_tokens_1, {"check": _no_run_folder, "needs_run": False}),
    ("yaml_recursive_config", "files", yaml_recursive("config", "show", "grpo"), {"needs_run": False}),
    ("yaml_recursive_no_import", "files", yaml_recursive("config", "show", "grpo", "--no-import"),
     {"needs_run": False}),
    ("yaml_recursive_train", "files", yaml_recursive("train", "grpo", "--smoke-random", "--out", "new-run"),
     {"check": _no_run_folder, "needs_run": False}),
    ("surrogate_question_train", "files", surrogate_question("train"), {"check": _no_run_folder, "needs_run": False}),
    ("surrogate_question_env_check", "files", surrogate_question("env-check"), {"needs_run": False}),
    ("view_surrogate_record", "files", view_surrogate_record, {}),
    ("latest_arabic_digits", "files", latest_arabic_digits, {}),
    ("verl_predictor_pickle", "files", verl_predictor_pickle, {"needs_run": False}),
]
