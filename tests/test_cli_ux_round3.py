"""The newcomer's third hour (issue 51, items 3-7 and 9), through the real command line: ``eval``
refuses data its model cannot encode and ``world build`` makes worlds the tiny model reads; W&B
without its package or key fails in one line; a stop by failing tools tells the truth about
checkpoints; unknown presets get "did you mean" and ``--help`` lists every preset; Ctrl-C says
where the run stopped and how to continue it; ``--overwrite`` removes a previous run and nothing else."""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers_cli import invoke, one_line
from tracerl.config.checks import wandb_login_problem
from tracerl.config.preset_help import PRESET_HELP
from tracerl.config.presets import PRESETS
from tracerl.runs.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
RUN_ENTRIES = "LATEST, ckpt-000001/, config.yaml, initial/, metrics.jsonl, rollouts/"
"""What a one-step --smoke-random run writes (besides .lock; no plot: random-tiny draws none), sorted."""


def smoke_random_run(out: Path, *extra: str) -> None:
    result = invoke("train", "grpo", "--smoke-random", "--out", str(out), "--steps", "1", "--set", "eval.size=2",
                    *extra)
    assert result.exit_code == 0, result.output


# --- 3. eval refuses what its model cannot encode; world build makes what the tiny model reads ----


def test_eval_refuses_a_world_the_tiny_model_cannot_read(tmp_path: Path) -> None:
    build = invoke("world", "build", "--seed", "7", "--size", "full", "--num-train", "10", "--num-test", "30",
                   "--out", str(tmp_path / "full"))
    assert build.exit_code == 0 and build.stdout.startswith("2800 documents"), build.output
    one_line(invoke("eval", "--model", "tiny", "--tasks", str(tmp_path / "full" / "test.jsonl"),
                    "--corpus", str(tmp_path / "full" / "corpus.jsonl"), "--no-progress"),
             "eval failed: --model tiny cannot encode", "of 30 sampled gold answers",
             "tracerl world build --seed 7 --out world")


def test_the_default_world_is_one_the_tiny_model_reads(tmp_path: Path) -> None:
    build = invoke("world", "build", "--seed", "7", "--num-train", "10", "--num-test", "30",
                   "--out", str(tmp_path / "world"))
    assert build.exit_code == 0 and build.stdout.startswith("700 documents"), build.output  # 250+125+20+125+75+105
    result = invoke("eval", "--model", "tiny", "--tasks", str(tmp_path / "world" / "test.jsonl"),
                    "--corpus", str(tmp_path / "world" / "corpus.jsonl"), "--limit", "2", "--no-progress")
    assert result.exit_code == 0, result.output
    assert '"tasks": 2.0' in result.stdout


def test_eval_of_a_run_on_other_files_runs_the_same_guard(tmp_path: Path) -> None:
    smoke_random_run(tmp_path / "run")  # random-tiny: a vocabulary of the smoke world's names
    assert invoke("world", "build", "--seed", "7", "--size", "full", "--num-train", "10", "--num-test", "20",
                  "--out", str(tmp_path / "full")).exit_code == 0
    one_line(invoke("eval", "--run", str(tmp_path / "run"), "--tasks", str(tmp_path / "full" / "test.jsonl"),
                    "--corpus", str(tmp_path / "full" / "corpus.jsonl"), "--no-progress"),
             f"the model of run {tmp_path / 'run'} cannot encode", "of 20 sampled gold answers")


# --- 4. W&B: the package, then the key, checked before the run folder exists ----------------------


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed: the key test runs")
def test_wandb_without_the_package_is_one_line(tmp_path: Path) -> None:
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(tmp_path / "r"), "--set", "log.wandb=true"),
             "log.wandb = true needs the wandb package", "pip install -e '.[wandb]'")
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (the extra)")
def test_wandb_without_a_key_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(tmp_path / "r"), "--set", "log.wandb=true"),
             "no W&B API key", "wandb login", "WANDB_MODE=offline")
    assert not (tmp_path / "r").exists()


def test_wandb_login_is_read_where_wandb_reads_it(tmp_path: Path) -> None:
    problem = wandb_login_problem({}, tmp_path)
    assert problem is not None and "`wandb login`" in problem and "WANDB_MODE=offline" in problem
    assert wandb_login_problem({"WANDB_MODE": "offline"}, tmp_path) is None
    assert wandb_login_problem({"WANDB_MODE": "online"}, tmp_path) == problem
    assert wandb_login_problem({"WANDB_API_KEY": "  "}, tmp_path) == problem  # blank is no key
    assert wandb_login_problem({"WANDB_API_KEY": "k" * 40}, tmp_path) is None
    (tmp_path / ".netrc").write_text("machine example.org login user password secret\n")
    assert wandb_login_problem({}, tmp_path) == problem  # another host's entry
    assert wandb_login_problem({"WANDB_BASE_URL": "https://example.org"}, tmp_path) is None
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert wandb_login_problem({}, tmp_path) is None  # what `wandb login` writes


# --- 5. a stop by failing tools names the checkpoint a resume continues from ------------------------

DEAD_SEARCH = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
               "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3",
               "data.environment=helpers_faults:dead_search_environment", "data.max_failed_tool_steps=2"]


@pytest.mark.parametrize(("cadence", "truth"), [
    ("10", "no checkpoint was written yet, so a resume starts over from step 0"),
    ("1", "the last checkpoint is {run}/ckpt-000001 (step 1), where a resume continues"),
])
def test_a_stop_by_failing_tools_tells_the_truth_about_checkpoints(tmp_path: Path, cadence: str, truth: str) -> None:
    run = tmp_path / "run"
    sets = [arg for item in [*DEAD_SEARCH, f"log.checkpoint_every={cadence}"] for arg in ("--set", item)]
    result = invoke("train", "grpo", "--smoke-random", "--out", str(run), "--steps", "5", *sets)
    line = one_line(result, "tool 'search' failed every call in 2 consecutive steps", truth.format(run=run))
    assert "intact" not in line
    assert (run / "ckpt-000001").exists() == (cadence == "1")


# --- 6. unknown presets, and every preset in --help --------------------------------------------------


def expand(names: str) -> set[str]:
    """``a, b_{x,y}`` -> {a, b_x, b_y}: the shell brace style the refusal lists presets in."""
    found: set[str] = set()
    for part in re.split(r", (?![^{]*})", names):
        grouped = re.fullmatch(r"(\w+)_\{(.*)\}", part)
        found |= {f"{grouped[1]}_{v}" for v in grouped[2].split(",")} if grouped else {part}
    return found


def test_an_unknown_preset_gets_did_you_mean_and_every_name(tmp_path: Path) -> None:
    line = one_line(invoke("train", "tarce", "--out", str(tmp_path / "r")),
                    "train failed: unknown preset 'tarce' (did you mean 'trace'?); valid presets: ")
    listed = line.split("valid presets: ")[1].removesuffix(" (tracerl train --help: one line each)")
    assert expand(listed) == set(PRESETS)
    assert not (tmp_path / "r").exists()


def test_train_help_lists_every_preset_with_one_line() -> None:
    assert list(PRESET_HELP) == list(PRESETS)  # a new preset needs its line
    result = invoke("train", "--help")
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    for name, text in PRESET_HELP.items():
        assert f"{name} {text}" in lines, name
    assert f"Presets ({len(PRESETS)}):" in lines


def test_train_help_says_the_smoke_model_ships() -> None:
    text = " ".join(invoke("train", "--help").stdout.split())
    assert "(shipped in the package)" in text and "pretrained once, cached" not in text


# --- 7. Ctrl-C: one line with the step reached and the command that continues -----------------------


@pytest.mark.slow
def test_ctrl_c_names_the_step_the_checkpoint_and_the_resume_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1", "OMP_NUM_THREADS": "1",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    env.pop("TRACERL_DEBUG", None)
    command = [sys.executable, "-m", "tracerl.cli", "train", "grpo", "--smoke-random", "--out", str(out),
               "--steps", "200", "--set", "log.checkpoint_every=1", "--set", "eval.size=2"]
    # A shell that started pytest in the background made children ignore SIGINT: restore the default,
    # under which Python turns SIGINT into KeyboardInterrupt.
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []  # stderr drained as it comes, so a full pipe never blocks the child
    readers = [threading.Thread(target=lambda: [lines.put(x) for x in iter(child.stdout.readline, "")] + [lines.put(None)],
                                daemon=True),
               threading.Thread(target=lambda: errors.extend(iter(child.stderr.readline, "")), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        while True:  # step 2's line: step 1's checkpoint was written before step 2 began
            line = lines.get(timeout=600)  # a bound on a hung child, not a timing assertion
            assert line is not None, "".join(errors)
            if line.startswith("step 2/200"):
                break
        child.send_signal(signal.SIGINT)
        child.wait(timeout=600)
        for reader in readers:
            reader.join(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    stderr = "".join(errors)
    assert child.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"interrupted after step (\d+) of 200; the last checkpoint is (\S+) \(step (\d+)\), where "
                         r"a resume continues; continue with: (.*)", last)
    assert found is not None, stderr
    reached, checkpoint, saved, resume = int(found[1]), Path(found[2]), int(found[3]), found[4]
    assert reached == read_metrics(out)[-1]["step"] and saved in (reached - 1, reached) and saved >= 1
    assert checkpoint == out / f"ckpt-{saved:06d}" and (out / "LATEST").read_text().strip() == checkpoint.name
    assert resume == f"tracerl train --resume {shlex.quote(str(out))}"
    args = shlex.split(resume)[1:]
    assert invoke(*args, "--steps", str(reached + 1)).exit_code == 0  # the command continues it


# --- 9. --overwrite removes a previous run, and only that -------------------------------------------


def test_overwrite_names_what_it_removes_and_keeps_the_users_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    smoke_random_run(run)
    (run / "notes.txt").write_text("mine")
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(run), "--steps", "1"), "--overwrite")
    result = invoke("train", "grpo", "--smoke-random", "--out", str(run), "--steps", "1", "--set", "eval.size=2",
                    "--overwrite")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (f"overwrite: removing the previous run in {run}: {RUN_ENTRIES} "
                                             "(other files there stay)")
    assert (run / "notes.txt").read_text() == "mine" and [r["step"] for r in read_metrics(run)] == [1]


def test_overwrite_of_a_folder_that_holds_no_run_removes_nothing(tmp_path: Path) -> None:
    mine = tmp_path / "thesis"
    (mine / "chapters").mkdir(parents=True)
    (mine / "draft.txt").write_text("years of work")
    (mine / "rollouts").mkdir()  # a name tracerl writes, but no run was ever here
    smoke_random_run(mine, "--overwrite")
    assert (mine / "draft.txt").read_text() == "years of work" and (mine / "chapters").is_dir()
    assert (mine / "rollouts").is_dir()


def test_overwrite_refuses_a_run_folder_with_a_link_inside(tmp_path: Path) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    smoke_random_run(run)
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    (run / "view").symlink_to(elsewhere)
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(run), "--steps", "1", "--overwrite"),
             "symbolic link")
    assert (elsewhere / "keep.txt").read_text() == "keep" and (run / "ckpt-000001").is_dir()
