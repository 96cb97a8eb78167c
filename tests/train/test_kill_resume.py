"""Kills at the worst moments, stale folders, non-finite training: the Trainer loses nothing (issue 14).

In-process kills are simulated by an exception raised where the process would die, followed by
``close()`` (the kernel releases a dead process's lock); the last test sends real SIGKILLs to
``tracerl train`` processes through ``benchmarks/reliability/kill_resume.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.train import loop as loop_module
from tracerl.runs import state as runstate_module
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.train.loop import NonFiniteTrainingError, Trainer
from tracerl.runs.metrics import is_timing_key, read_metrics
from tracerl.train.run import resume_training, start_training
from tracerl.runs.folder import RunFolderError

from helpers_temps import dead_writer_temps

ROOT = Path(__file__).resolve().parents[2]
CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3", "optim.lr=1e-3",
         "log.checkpoint_every=1"]  # these tests kill around every step's checkpoint (the default is 10)


@pytest.fixture(autouse=True, scope="module")
def _pretrained() -> None:
    """Pretrain the smoke tiny model up front: pretraining inside a Trainer consumes random draws,
    so the first run of a session would not equal a later rerun of the same config."""
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))


class SimulatedKill(BaseException):
    """Raised where a SIGKILL would have ended the process."""


def cheap_config(*extra: str) -> TrainConfig:
    return resolve_config("grpo", smoke="random", overrides=[*CHEAP, *extra])


def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in records]


def kill_at_save(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Die when checkpoint ``step`` is about to be written (its metrics line is already on disk).

    Patch with a ``MonkeyPatch.context()``: undoing the test's own ``monkeypatch`` would also undo
    conftest's cache isolation.
    """
    real = runstate_module.save_checkpoint

    def save(run_dir: Path, at: int, *args: Any) -> Path:
        if at == step:
            raise SimulatedKill(f"killed before checkpoint {at}")
        return real(run_dir, at, *args)

    monkeypatch.setattr(runstate_module, "save_checkpoint", save)


def test_a_kill_between_metrics_line_and_checkpoint_reruns_the_lost_steps_exactly_once(tmp_path: Path) -> None:
    """On main the line was written after the checkpoint, so this kill lost a step's line for good."""
    with Trainer(cheap_config("steps=4", "log.checkpoint_every=2"), tmp_path / "straight") as straight:
        straight.run()
    killed = Trainer(cheap_config("steps=4", "log.checkpoint_every=2"), tmp_path / "killed")
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SimulatedKill):
        kill_at_save(patch, 4)
        killed.run()
    killed.close()
    assert [r["step"] for r in read_metrics(tmp_path / "killed")] == [1, 2, 3, 4]  # durable before the checkpoint
    run = resume_training(tmp_path / "killed")  # LATEST is ckpt-000002: steps 3 and 4 run again
    run()
    assert (tmp_path / "killed" / "LATEST").read_text() == "ckpt-000004"
    assert comparable(read_metrics(tmp_path / "killed")) == comparable(read_metrics(tmp_path / "straight"))


def test_a_kill_before_the_first_checkpoint_then_fresh_start_is_refused_and_resume_starts_over(tmp_path: Path) -> None:
    first = Trainer(cheap_config("steps=2"), tmp_path)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SimulatedKill):
        kill_at_save(patch, 1)
        first.run()
    first.close()
    lost = read_metrics(tmp_path)
    assert [r["step"] for r in lost] == [1] and not (tmp_path / "LATEST").exists()
    with pytest.raises(RunFolderError, match=r"initial, metrics.jsonl\); continue it with --resume"):
        start_training("grpo", tmp_path, smoke="random", overrides=CHEAP, steps=2)
    resume_training(tmp_path)()  # no checkpoint: the run restarts from step 0 with its config.yaml
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert comparable(records[:1]) == comparable(lost)  # the restart is the same run, not a reuse of stale state


def test_a_stale_initial_of_another_model_is_never_reused(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tracerl.testbed.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(["an unrelated vocabulary"])
    other = AutoModelForCausalLM.from_config(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=8, intermediate_size=16))
    other.save_pretrained(tmp_path / "initial")
    tokenizer.save_pretrained(tmp_path / "initial")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunFolderError, match="initial"):
        Trainer(cheap_config(), tmp_path)
    with Trainer(cheap_config(), tmp_path, resume=True) as trainer:  # no checkpoint: rebuilt from the config
        hidden = trainer.model.config.hidden_size
    assert hidden != 8
    assert json.loads((tmp_path / "initial" / "config.json").read_text())["hidden_size"] == hidden
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_kill_while_initial_is_written_leaves_a_temporary_that_the_next_start_removes(tmp_path: Path) -> None:
    (name,) = dead_writer_temps(tmp_path, dirs=["initial"])  # its config.json written, the tokenizer never was
    partial = tmp_path / name
    with Trainer(cheap_config(), tmp_path):  # a temporary is not run state: a fresh start is fine
        pass
    assert not partial.exists()
    assert (tmp_path / "initial" / "tokenizer.json").exists() and (tmp_path / "initial" / "config.json").exists()


def test_a_failed_fresh_start_leaves_no_half_made_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise ValueError("tasks.jsonl:3: not JSON")

    monkeypatch.setattr(loop_module, "load_task_data", broken)
    with pytest.raises(ValueError, match="tasks.jsonl:3"):
        Trainer(cheap_config(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_second_trainer_process_on_the_folder_fails_at_once_and_writes_nothing(tmp_path: Path) -> None:
    """On main two `tracerl train` processes on one --out both exited 0, writing every step twice."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from tracerl.runs.folder import "
         "RunLock; lock = RunLock(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        for resume in (False, True):
            with pytest.raises(RunFolderError, match=f"pid {holder.pid} "):
                Trainer(cheap_config(), tmp_path, resume=resume)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


def test_resume_needs_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="no checkpoint and no config.yaml"):
        resume_training(tmp_path)


def nan_update(*args: object) -> dict[str, float]:
    """What ``policy_update`` reports for a step it skipped: NaN loss, ``nonfinite_skipped`` set."""
    nan = float("nan")
    return {"loss": nan, "grad_norm": nan, "kl": 0.0, "clip_fraction": 0.0, "trained_tokens": 0.0,
            "nonfinite_skipped": 1.0}


def test_non_finite_steps_in_a_row_stop_the_run_naming_the_last_good_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Trainer(cheap_config("steps=10"), tmp_path) as trainer:
        trainer.run(1)
        good = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        monkeypatch.setattr(trainer, "_update", nan_update)
        trainer.config.optim.max_nonfinite_steps = 2  # type: ignore[attr-defined]
        with pytest.raises(NonFiniteTrainingError, match=r"steps 2..3 .*\(2 in a row.*ckpt-000002 \(LATEST\)"):
            trainer.run()
        assert all(torch.equal(good[k], v) for k, v in trainer.model.state_dict().items())
    records = read_metrics(tmp_path)
    assert [(r["step"], r["nonfinite_skipped_total"]) for r in records] == [(1, 0), (2, 1), (3, 2)]
    assert records[1]["loss"] is None  # NaN is written as null
    assert (tmp_path / "LATEST").read_text() == "ckpt-000002"  # step 2 changed nothing: still a good checkpoint


def test_a_finite_step_resets_the_streak(tmp_path: Path) -> None:
    with Trainer(cheap_config(), tmp_path) as trainer:
        for skipped, streak in [(1.0, 1), (0.5, 2), (0.0, 0), (None, 0), (1.0, 1)]:
            record: dict[str, Any] = {} if skipped is None else {"nonfinite_skipped": skipped}
            trainer._count_nonfinite(record)
            assert trainer.nonfinite["streak"] == streak
        assert record["nonfinite_skipped_total"] == 3


def test_save_never_writes_non_finite_weights(tmp_path: Path) -> None:
    with Trainer(cheap_config("steps=3"), tmp_path) as trainer:
        trainer.run(1)
        trainer.step()
        with torch.no_grad():
            next(trainer.model.parameters()).view(-1)[0] = math.inf
        with pytest.raises(NonFiniteTrainingError, match=r"is not finite at step 2.*ckpt-000001"):
            trainer.save()
    assert (tmp_path / "LATEST").read_text() == "ckpt-000001"
    assert sorted(p.name for p in tmp_path.iterdir() if "ckpt" in p.name) == ["ckpt-000001"]


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("kill_resume", ROOT / "benchmarks" / "reliability" / "kill_resume.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_random_sigkills_of_training_processes_lose_nothing(tmp_path: Path) -> None:
    """The CI subset of ``python benchmarks/reliability/kill_resume.py --kills 50``: 6 real SIGKILLs."""
    harness = _harness()
    summary = harness.run_harness(tmp_path, kills=6, steps=8, seed=1, model=harness.smoke_model())
    assert summary["problems"] == [] and summary["ok"]
    # Each kill ends one process; a kill that lands after the last checkpoint (while the process
    # exits) needs no process after it, so 6 processes is the floor, not 7.
    assert summary["kills"] == 6 and summary["processes"] >= 6
    assert os.listdir(tmp_path)  # the runs are there to inspect when it fails
