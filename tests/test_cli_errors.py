"""One-line errors: every user-caused failure of the CLI ends in one stderr line, exit 1 (2 for
usage), names the field/file, and leaves no run folder behind; bugs keep their traceback."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.errors import UserError, one_line

TASK = '{{"id": "{i}", "question": "Who is {i}?", "answers": ["A{i}"]}}\n'
DOC = '{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n'


def invoke(*args: str, env: dict[str, str] | None = None):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, list(args), env=env)


def assert_one_line(result, code: int, *needles: str) -> str:  # noqa: ANN001
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("rollout.budget=5", "rollout.budget"),
        ("rollout.schemes.group_size=1", "rollout.schemes.group_size"),
        ("optim.betas=[2,3]", "optim.betas"),
        ("model.device=cuda:64", "model.device"),
        ("optim.lr=.inf", "optim.lr"),
        ("rollout.engine.temperature=0", "eval.temperature=0"),
        ("model.name_or_path=/no/such/model", "no such folder"),
        ("steps=0", "steps must be >= 1"),
        ("data.source=files", "data.tasks"),
    ],
)
def test_bad_config_is_one_line_and_creates_no_folder(tmp_path: Path, override: str, needle: str) -> None:
    out = tmp_path / "run"
    result = invoke("train", "grpo", "--smoke-random", "--out", str(out), "--set", override)
    assert_one_line(result, 1, "train failed:", needle)
    assert not out.exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert_one_line(invoke("train", "grpo", "--smoke-random", "--out", str(tmp_path / "r"), "--steps", "0"), 2, "--steps")
    assert_one_line(invoke("train", "--smoke-random"), 2, "--out")
    assert not (tmp_path / "r").exists()


def _files(tmp_path: Path, tasks: bytes, eval_tasks: bytes | None = None) -> list[str]:
    (tmp_path / "tasks.jsonl").write_bytes(tasks)
    (tmp_path / "corpus.jsonl").write_text(DOC)
    sets = ["data.source=files", f"data.tasks={tmp_path / 'tasks.jsonl'}", f"data.corpus={tmp_path / 'corpus.jsonl'}"]
    if eval_tasks is not None:
        (tmp_path / "eval.jsonl").write_bytes(eval_tasks)
        sets.append(f"data.eval_tasks={tmp_path / 'eval.jsonl'}")
    return [arg for s in sets for arg in ("--set", s)]


GOOD = "".join(TASK.format(i=i) for i in range(3)).encode()


@pytest.mark.parametrize(
    ("tasks", "eval_tasks", "needles"),
    [
        (GOOD + b'{"id": "x", "answers": ["A"]}\n', None, ["tasks.jsonl:4", "question"]),
        (GOOD[:40] + b"\xff\xfe" + GOOD[40:], None, ["tasks.jsonl:1", "UTF-8"]),
        (b"\n\n", None, ["tasks.jsonl", "no tasks"]),
        (GOOD, TASK.format(i=9).encode() + TASK.format(i=1).encode(), ["eval.jsonl", "'1'", "data.eval_tasks"]),
    ],
    ids=["bad-line", "non-utf8", "empty", "eval-repeats-train-ids"],
)
def test_bad_data_files_fail_before_the_run_folder(tmp_path: Path, tasks: bytes, eval_tasks: bytes | None,
                                                   needles: list[str]) -> None:
    out = tmp_path / "run"
    result = invoke("train", "grpo", "--smoke-random", "--out", str(out), *_files(tmp_path, tasks, eval_tasks))
    assert_one_line(result, 1, *needles)
    assert not out.exists()


def test_env_check_rejects_an_empty_task_file(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("")
    (tmp_path / "corpus.jsonl").write_text(DOC)
    result = invoke("env-check", "--tasks", str(tmp_path / "tasks.jsonl"), "--corpus", str(tmp_path / "corpus.jsonl"))
    assert_one_line(result, 1, "env-check failed:", "tasks.jsonl", "no tasks")


def test_full_disk_names_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ENOSPC (writing /dev/full) inside the run: one line naming the run folder."""
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("needs the /dev/full device")
    import tracerl.train.run as run

    def start(*_: object, **__: object):  # noqa: ANN202
        def write() -> None:
            with open("/dev/full", "w") as handle:  # noqa: PTH123
                handle.write("x" * 65536)
        return write

    monkeypatch.setattr(run, "start_training", start)
    out = tmp_path / "run"
    result = invoke("train", "grpo", "--smoke-random", "--out", str(out))
    assert_one_line(result, 1, "no space left on device writing", str(out))


def test_a_bug_keeps_its_traceback_and_debug_shows_user_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracerl.train.run as run

    def broken(*_: object, **__: object) -> None:
        raise KeyError("internal state")  # not the user's fault: must not be hidden

    monkeypatch.setattr(run, "start_training", broken)
    result = invoke("train", "grpo", "--smoke-random", "--out", str(tmp_path / "run"))
    assert result.exit_code != 0 and isinstance(result.exception, KeyError)

    args = ("train", "grpo", "--smoke-random", "--out", str(tmp_path / "r"), "--set", "optim.lr=.inf")
    assert isinstance(invoke("--debug", *args).exception, UserError)  # re-raised: the traceback prints
    assert isinstance(invoke(*args, env={"TRACERL_DEBUG": "1"}).exception, UserError)
    assert_one_line(invoke(*args), 1, "optim.lr")


def test_debug_flag_prints_a_traceback_in_a_real_process(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "tracerl.cli", "train", "grpo", "--smoke-random", "--out", str(tmp_path / "r"),
            "--set", "optim.betas=[2,3]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("TRACERL_DEBUG", None)
    plain = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 1 and plain.stderr.strip().count("\n") == 0 and "optim.betas" in plain.stderr
    debug = subprocess.run(args[:3] + ["--debug"] + args[3:], capture_output=True, text=True, env=env, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "optim.betas" in debug.stderr


# --- damaged run folders (resume) -------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--steps", "1", "--out", str(out),
                                      "--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"])
    assert result.exit_code == 0, result.output
    return out


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda run: _truncate(run / "ckpt-000001" / "policy" / "model.safetensors"), "model.safetensors"),
        (lambda run: _truncate(run / "ckpt-000001" / "trainer.pt"), "trainer.pt"),
        (lambda run: (run / "LATEST").write_bytes(b"\xff\xfe garbage"), "LATEST"),
    ],
    ids=["truncated-weights", "truncated-trainer-state", "garbage-latest"],
)
def test_damaged_run_folder_fails_in_one_line_naming_the_file(finished_run: Path, tmp_path: Path, damage,  # noqa: ANN001
                                                             needle: str) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    damage(run)
    result = invoke("train", "--resume", str(run), "--steps", "2")
    assert_one_line(result, 1, "train failed:", needle)


def test_one_line_classifies_foreign_errors() -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert one_line(full, writing="runs/a") == (
        "no space left on device writing runs/a; free some space (a run resumes from its last checkpoint)")
    assert one_line(FileNotFoundError(errno.ENOENT, "No such file or directory", "x.yaml")) == (
        "No such file or directory: x.yaml")
    assert one_line(UserError("line one\n  line two")) == "line one line two"
    assert one_line(RuntimeError("PytorchStreamReader failed reading zip archive")).startswith("a file it reads is corrupt")
    rust_full = type("SafetensorError", (Exception,), {})("Error while serializing: IoError(Os { code: 28, kind: "
                                                          "StorageFull, message: \"No space left on device\" })")
    assert one_line(rust_full, writing="runs/a").startswith("no space left on device writing runs/a")
    assert "could not write under runs/a (is the disk full?)" in one_line(
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), writing="runs/a")
    assert one_line(KeyError("x")) is None and one_line(RuntimeError("shape mismatch")) is None


def test_eval_names_a_missing_model_and_device(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(TASK.format(i=1))
    (tmp_path / "c.jsonl").write_text(DOC)
    common = ["eval", "--tasks", str(tmp_path / "t.jsonl"), "--corpus", str(tmp_path / "c.jsonl")]
    result = invoke(*common, "--model", str(tmp_path / "no-model"), env={"HF_HUB_OFFLINE": "1"})
    assert_one_line(result, 1, "eval failed: --model = ", "no such folder")
    assert_one_line(invoke(*common, "--model", "tiny", "--device", "cuda:64"), 1, "--device = 'cuda:64'")
