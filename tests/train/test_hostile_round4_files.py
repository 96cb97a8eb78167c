"""Issue 50, files: nothing of the user's is deleted (tracerl's temporaries carry its name and
marker), every output is written atomically (``eval --out`` on a full disk), a failed start leaves
no run state, and hostile config, task, pointer and record files end in one line naming them."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.atomic import FOLDER_MARK, PID_MAX, make_temp_dir, open_temp, pid_alive, remove_stale_temps, temp_owner
from tracerl.config.schema import resolve_config
from tracerl.runs.folder import run_state
from tracerl.train.loop import Trainer

from helpers_cli import invoke, one_line, smoke_run
from helpers_temps import dead_writer_temps, own_temps
from view_fixtures import write_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--smoke-random", "--steps", "1", "--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-step smoke run with a checkpoint (copied by each test that changes it)."""
    return smoke_run(tmp_path_factory.mktemp("round4") / "run")


def _user_files(folder: Path) -> dict[str, bytes]:
    """Files a user keeps in ``folder`` whose names look like other programs' temporaries."""
    (folder / ".backup.tmp-1").mkdir(parents=True)
    (folder / ".backup.tmp-1" / "d").write_bytes(b"x")
    (folder / f".ed.tmp-{os.getpid()}").write_bytes(b"y")  # its pid is alive
    (folder / ".thesis.tmp-999999").mkdir()
    (folder / ".thesis.tmp-999999" / "chapter1.tex").write_bytes(b"chapter")
    (folder / ".notes.txt.tmp-4000000").write_bytes(b"notes")
    (folder / ".x.tmp-99999999999999999999").write_bytes(b"past any pid")
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _still(folder: Path, files: dict[str, bytes]) -> None:
    assert {name: (folder / name).read_bytes() for name in files} == files


# --- items 1, 2, 14: tracerl deletes only what it created ------------------------------------


def test_train_keeps_the_users_temporary_looking_files_and_removes_its_own(tmp_path: Path) -> None:
    out = tmp_path / "P"
    files = _user_files(out)
    ours = dead_writer_temps(out, files=["metrics.jsonl"], dirs=["initial"])  # a killed run's leftovers
    result = invoke("train", "grpo", *SMOKE, "--out", str(out))
    assert result.exit_code == 0, result.output
    _still(out, files)
    assert not any((out / name).exists() for name in ours) and own_temps(out) == []
    assert run_state(out) == ["LATEST", "ckpt-000001", "initial", "metrics.jsonl"]


def test_view_keeps_the_users_files_in_its_output_folder(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1)
    files = _user_files(tmp_path / "U")
    (stale,) = dead_writer_temps(tmp_path / "U", files=["index.html"])  # a killed view's page
    result = invoke("view", str(tmp_path / "run"), "--out", str(tmp_path / "U"))
    assert result.exit_code == 0, result.output
    _still(tmp_path / "U", files)
    assert not (tmp_path / "U" / stale).exists() and (tmp_path / "U" / "index.html").is_file()
    (tmp_path / "run" / "view").mkdir()
    (tmp_path / "run" / "view" / ".x.tmp-99999999999999999999").write_bytes(b"x")  # was an OverflowError
    result = invoke("view", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "view" / ".x.tmp-99999999999999999999").read_bytes() == b"x"


def test_only_marked_temporaries_of_tracerl_are_removed(tmp_path: Path) -> None:
    unmarked = make_temp_dir(tmp_path / "initial")
    (unmarked / FOLDER_MARK).unlink()  # a folder by tracerl's name that holds no marker: not provably ours
    copied = make_temp_dir(tmp_path / "ckpt-000001")
    shutil.copytree(copied, tmp_path / copied.name.replace("ckpt-000001", "ckpt-000002"))  # marker names another
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"k")
    linked, fd = open_temp(tmp_path / "LATEST")
    os.close(fd)
    linked.unlink()
    linked.symlink_to(elsewhere)  # a link at a temporary's name: never followed nor removed
    forged = tmp_path / ".metrics.jsonl.tracerl-tmp-1-0123456789abcdef"  # the shape without the keyed tag
    forged.write_bytes(b"f")
    assert remove_stale_temps(tmp_path, holding_lock=True) == [copied.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [unmarked.name, copied.name.replace("ckpt-000001", "ckpt-000002"), "elsewhere", linked.name, forged.name])
    assert (elsewhere / "keep").read_bytes() == b"k"


def test_a_pid_past_the_platforms_range_is_never_probed() -> None:
    for pid in (0, -1, PID_MAX + 1, 10**20):
        assert pid_alive(pid)  # counted alive: nothing of such a writer is removed, and os.kill is not called
    assert temp_owner(".x.tmp-99999999999999999999") is None
    assert temp_owner(".index.html.tracerl-tmp-99999999999-0123456789abcdef") is None


# --- item 3: every output atomic, eval --out included ----------------------------------------


def _full_disk_at(limit: int) -> None:
    """In the child: files cannot grow past ``limit`` bytes (EFBIG, as a full disk's ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_eval_out_on_a_full_disk_leaves_the_earlier_file_whole(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "F.jsonl"
    out.write_bytes(b'{"earlier": "content"}\n' * 100)
    before = out.read_bytes()
    command = [sys.executable, "-m", "tracerl.cli", "eval", "--run", str(finished), "--samples", "8",
               "--temperature", "1", "--limit", "2", "--no-progress", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, preexec_fn=lambda: _full_disk_at(4096),
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"eval failed: File too large: {out}", done.stderr
    assert out.read_bytes() == before  # the earlier content, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["F.jsonl"]  # and no temporary left


def test_eval_out_through_a_planted_hard_link_breaks_it_off(finished: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs.txt"
    theirs.write_bytes(b"someone else's file\n")
    out = tmp_path / "F.jsonl"
    os.link(theirs, out)
    result = invoke("eval", "--run", str(finished), "--limit", "1", "--no-progress", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert theirs.read_bytes() == b"someone else's file\n"  # the other name keeps its content
    assert out.stat().st_nlink == 1 and out.read_text().startswith('{"task_id": ')


# --- item 11: a failed start leaves no run state ---------------------------------------------


def test_a_failed_start_leaves_no_run_state_and_the_corrected_command_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "view").mkdir(parents=True)
    (out / "view" / "mine.html").write_bytes(b"my page")
    (out / "notes.txt").write_bytes(b"my notes")
    bad = invoke("train", "grpo", *SMOKE, "--set", "rollout.engine.max_total_tokens=1", "--out", str(out))
    one_line(bad, "max_total_tokens is 1")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "notes.txt", "view"]  # what was there, and the lock
    assert [p.name for p in (out / "view").iterdir()] == ["mine.html"]
    good = invoke("train", "grpo", *SMOKE, "--out", str(out))
    assert good.exit_code == 0, good.output
    assert (out / "notes.txt").read_bytes() == b"my notes" and (out / "LATEST").read_text() == "ckpt-000001"
    fresh = tmp_path / "fresh"
    one_line(invoke("train", "grpo", *SMOKE, "--set", "rollout.engine.max_total_tokens=1", "--out", str(fresh)),
             "max_total_tokens is 1")
    assert not fresh.exists()  # the folder this start created goes with it


def test_a_failure_after_a_checkpoint_keeps_the_run_to_resume(tmp_path: Path) -> None:
    config = resolve_config("grpo", smoke="random", overrides=["steps=1", "eval.size=2", "rollout.engine.max_turns=2"])
    with pytest.raises(RuntimeError, match="after its first checkpoint"), Trainer(config, tmp_path / "new") as trainer:
        trainer.run()
        raise RuntimeError("failed after its first checkpoint")
    assert run_state(tmp_path / "new") == ["LATEST", "ckpt-000001", "initial", "metrics.jsonl"]


# --- item 12: recursive YAML anchors ---------------------------------------------------------


@pytest.mark.parametrize("text", ["optim: &o {self: *o}\n", "optim:\n  betas: &b [0.9, *b]\n",
                                  "optim: &o\n  <<: *o\n"])
def test_recursive_yaml_anchors_are_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rec.yaml"
    path.write_text(text)
    for args in (["config", "show", "grpo", "--config", str(path)],
                 ["config", "show", "grpo", "--no-import", "--config", str(path)],
                 ["train", "grpo", "--smoke-random", "--config", str(path), "--out", str(tmp_path / "out")]):
        one_line(invoke(*args), str(path), "inside itself at line", "recursive alias")
    assert not (tmp_path / "out").exists()


def test_anchors_used_after_their_node_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("eval: {every: &n 7}\nlog: {checkpoint_every: *n}\n")
    result = invoke("config", "show", "grpo", "--config", str(path))
    assert result.exit_code == 0, result.output
    assert "every: 7" in result.output and "checkpoint_every: 7" in result.output


# --- item 13 and the viewer: lone surrogates --------------------------------------------------

TASKS = ('{"id": "1", "question": "Where was Ada born?", "answers": ["Lumen"]}\n'
         '{"id": "2", "question": "Who \\ud800 wrote it?", "answers": ["Varo"]}\n')
CORPUS = '{"id": "d1", "title": "Ada", "text": "Ada Stone was born in Lumen."}\n'


def test_a_lone_surrogate_in_a_question_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    tasks, corpus = tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl"
    tasks.write_text(TASKS)
    corpus.write_text(CORPUS)
    where = f"{tasks}:2: field 'question' holds a lone surrogate (U+D800 at character 4)"
    one_line(invoke("env-check", "--tasks", str(tasks), "--corpus", str(corpus)), where)
    one_line(invoke("train", "grpo", "--smoke-random", "--steps", "1", "--set", f"data.tasks={tasks}",
                    "--set", f"data.corpus={corpus}", "--out", str(tmp_path / "out")), where)
    assert not (tmp_path / "out").exists()


def test_view_names_the_record_holding_a_lone_surrogate(tmp_path: Path) -> None:
    import gzip

    write_run(tmp_path, steps=1)
    path = tmp_path / "rollouts" / "step-000001.jsonl.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    assert '"question":"Where was Ada born?"' in text
    path.write_bytes(gzip.compress(text.replace("Where was Ada", "Where was \\ud800Ada", 1).encode()))
    one_line(invoke("view", str(tmp_path)), f"{path}:1: question: holds a lone surrogate (U+D800 at character 10)")


# --- LATEST with digits other than ASCII ------------------------------------------------------


def test_latest_with_arabic_indic_digits_is_refused(finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "ckpt-000001").rename(run / "ckpt-\u0660\u0660\u0660\u0660\u0660\u0661")
    (run / "LATEST").write_text("ckpt-\u0660\u0660\u0660\u0660\u0660\u0661")
    one_line(invoke("train", "--resume", str(run), "--steps", "2"), f"{run / 'LATEST'} does not hold a checkpoint name")
    assert "ckpt-\u0660\u0660\u0660\u0660\u0660\u0661" not in run_state(run)  # not a checkpoint folder either
