"""Run guard rails: rollout records stay consistent with the checkpoint across a kill, keep_last,
initial/ as a checked reference to an on-disk base model, CPU threads, the tiny cache's temps,
grouped logging tags."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers_temps import dead_writer_temps
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.runs import state as runstate_module
from tracerl.runs.checkpoint import prune_checkpoints
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import flat_hparams, read_metrics, tag
from tracerl.runs.rollout_log import logged_steps, read_step, step_file
from tracerl.runs.folder import RunFolderError

CHEAP = ["data.verifier=answered", "eval.every=0", "eval.size=2", "rollout.budget=8", "rollout.pool_size=2",
         "rollout.engine.max_turns=3"]


def cheap(*extra: str) -> TrainConfig:
    return resolve_config("trace", smoke="random", overrides=[*CHEAP, *extra])


class SimulatedKill(BaseException):
    """Raised where a SIGKILL would have ended the process."""


def test_rollout_files_follow_the_checkpoint_across_a_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed just before checkpoint 3: its metrics line and rollout file are on disk but the
    checkpoint is step 2. Resume drops step 3's file, reruns the step and writes the same bytes."""
    config = cheap("steps=3", "log.checkpoint_every=2")
    real = runstate_module.save_checkpoint

    def save(run_dir: Path, at: int, *args: Any, **kwargs: Any) -> Path:
        if at == 3:
            raise SimulatedKill
        return real(run_dir, at, *args, **kwargs)

    killed = Trainer(config, tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(runstate_module, "save_checkpoint", save)
        with pytest.raises(SimulatedKill):
            killed.run()
    killed.close()
    lost = step_file(tmp_path, 3).read_bytes()
    trees = read_step(tmp_path, 1)  # the trace preset: predictor values and readiness are recorded
    assert len(trees) == read_metrics(tmp_path)[0]["prompts"]
    assert all(0 < n["predictor"] < 1 for tree in trees for n in tree["nodes"])
    for traj in (t for tree in trees for t in tree["trajectories"] if not t["infra_failed"]):
        assert len(traj["turn_advantage"]) == len(traj["node_path"]) - 1 and traj["readiness"] is not None
    assert logged_steps(tmp_path) == [1, 2, 3] and [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    with Trainer(config, tmp_path, resume=True) as resumed:
        assert logged_steps(tmp_path) == [1, 2] and [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
        resumed.run()
    assert step_file(tmp_path, 3).read_bytes() == lost
    assert logged_steps(tmp_path) == [1, 2, 3]


def test_keep_last_and_the_checkpoint_default(tmp_path: Path) -> None:
    assert TrainConfig().log.checkpoint_every == 10 and TrainConfig().log.keep_last == 1
    with Trainer(cheap("steps=3", "log.checkpoint_every=1", "log.keep_last=2", "log.rollouts=false"), tmp_path) as t:
        t.run()
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-000002", "ckpt-000003"]
    assert not (tmp_path / "rollouts").exists()  # log.rollouts=false writes none


def test_prune_keeps_the_current_and_the_newest_older_ones(tmp_path: Path) -> None:
    for step in (1, 3, 4, 5, 7):  # 7: left by a history abandoned when the run resumed from 5
        (tmp_path / f"ckpt-{step:06d}").mkdir()
    assert prune_checkpoints(tmp_path, "ckpt-000005", keep_last=2) == ["ckpt-000001", "ckpt-000003", "ckpt-000007"]
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-000004", "ckpt-000005"]
    assert prune_checkpoints(tmp_path, "ckpt-000005", keep_last=1) == ["ckpt-000004"]


def _model_folder(path: Path) -> Path:
    tok = bpe_tokenizer()
    tiny_model(len(tok), seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_initial_references_an_on_disk_base_model_and_resume_checks_it(tmp_path: Path) -> None:
    base = _model_folder(tmp_path / "base")
    run = tmp_path / "run"
    config = cheap("steps=1", f"model.name_or_path={base}", "model.format=react", "rollout.scheme=chain", "algo.estimator=grpo",
                   "algo.credit=false", "rollout.budget=8", "rollout.schemes.group_size=4")
    with Trainer(config, run) as trainer:
        trainer.run()
    assert [p.name for p in (run / "initial").iterdir()] == ["reference.json"]  # no copy of the weights
    with Trainer(config, run, resume=True) as resumed:
        assert resumed.step_index == 1
    weights = base / "model.safetensors"
    os.utime(weights, ns=(time.time_ns(), time.time_ns() + 10**9))  # rewritten in place
    with pytest.raises(RunFolderError, match="changed since the run started.*model.safetensors"):
        Trainer(config, run, resume=True)
    base.rename(tmp_path / "moved")
    with pytest.raises(RunFolderError, match="is gone"):
        Trainer(config, run, resume=True)


def test_thread_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.models.threads import available_cores, resolve_threads, set_threads

    monkeypatch.setenv("TRACERL_THREADS", "3")
    assert resolve_threads(2) == 2 and resolve_threads(0) == 3
    monkeypatch.delenv("TRACERL_THREADS")
    assert resolve_threads(0) == available_cores() >= 1
    monkeypatch.setenv("TRACERL_THREADS", "many")
    with pytest.raises(ValueError, match="TRACERL_THREADS='many'"):
        resolve_threads(0)
    monkeypatch.setenv("TRACERL_THREADS", "1" + "0" * 20)  # digits, but no machine has that many cores
    with pytest.raises(ValueError, match="from 1 to 4096"):
        resolve_threads(0)
    assert set_threads(0, "cuda") is None
    before = torch.get_num_threads()
    try:
        assert set_threads(1, "cpu") == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_pretraining_cache_removes_temps_of_dead_processes(tmp_path: Path) -> None:
    from tracerl.atomic import make_temp_dir
    from tracerl.testbed.tiny import remove_dead_temps

    (dead,) = dead_writer_temps(tmp_path, dirs=["abc123"])
    live = make_temp_dir(tmp_path / "def456")  # this process: maybe pretraining right now
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    (tmp_path / f".tmp-{child.pid}-abc").mkdir()  # a user's (or an older tracerl's) folder: never removed
    (tmp_path / ".x.tmp-99999999999999999999").mkdir()  # a pid past the platform's range: no OverflowError
    assert remove_dead_temps(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, f".tmp-{child.pid}-abc",
                                                                 ".x.tmp-99999999999999999999"])


def test_logging_tags_are_grouped_and_hparams_flat() -> None:
    assert [tag(k) for k in ("eval_accuracy", "time_rollout", "step_seconds", "peak_mem_gb_update", "loss")] == [
        "eval/accuracy", "time/rollout", "time/step_seconds", "time/peak_mem_gb_update", "train/loss"]
    hparams = flat_hparams(TrainConfig())
    assert hparams["log.keep_last"] == 1 and hparams["optim.lr"] == 3e-4
    assert isinstance(hparams["optim.betas"], str)  # hparams take scalars only


def test_step_zero_evaluation(tmp_path: Path) -> None:
    with Trainer(cheap("steps=1", "eval.at_start=true"), tmp_path) as trainer:
        trainer.run()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["generated_tokens"] == 0 and "eval_accuracy" in records[0]
