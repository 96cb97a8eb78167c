"""One run, one folder; crash-consistent metrics; safe loading (issue 14), without training.

Each test reproduces one finding of the fault probe on the pieces it concerns: the run-folder
lock, the metrics file, the checkpoint loader.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.testbed.tiny import build_tiny_tokenizer
from tracerl.runs import metrics as metrics_module
from tracerl.runs import folder as runfolder
from tracerl.runs.checkpoint import (
    LATEST,
    CheckpointError,
    RngState,
    first_nonfinite,
    latest_checkpoint,
    load_policy_into,
    load_trainer_state,
    save_checkpoint,
)
from tracerl.runs.metrics import MetricsLog, parse_metrics, read_metrics
from tracerl.atomic import open_temp
from tracerl.runs.folder import RunFolderError, RunLock, refuse_if_state, remove_stale_temps, run_state

from helpers_temps import dead_writer_temps, own_temps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[object, object]:
    tokenizer = build_tiny_tokenizer(["Question: who wrote Velmora ? Action: search[Velmora]"])
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), tokenizer


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- one run, one folder ------------------------------------------------------------------------


def test_a_second_process_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from tracerl.runs.folder import "
         "RunLock; lock = RunLock(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        with pytest.raises(RunFolderError, match=f"in use by another tracerl process \\(pid {holder.pid} "):
            RunLock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    RunLock(tmp_path).release()  # the kernel dropped the killed holder's lock


def test_the_lock_records_the_holder_and_is_exclusive_within_a_process(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    with pytest.raises(RunFolderError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path)
    lock.release()
    RunLock(tmp_path).release()


def test_a_fresh_start_refuses_any_run_state_naming_it(tmp_path: Path) -> None:
    refuse_if_state(tmp_path / "missing")  # nothing there yet: allowed
    (tmp_path / "config.yaml").write_text("steps: 2\n")
    (tmp_path / ".lock").write_text("")
    refuse_if_state(tmp_path)  # a config and a lock alone are not a run
    for name in ("metrics.jsonl", "initial", "ckpt-000002", "LATEST"):
        folder = tmp_path / name
        folder.mkdir() if name in ("initial", "ckpt-000002") else folder.write_text("x")
        with pytest.raises(RunFolderError, match=f"{name}.*--resume"):
            refuse_if_state(folder.parent)
    assert run_state(tmp_path) == ["LATEST", "ckpt-000002", "initial", "metrics.jsonl"]


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    dead = dead_writer_temps(tmp_path, files=["LATEST"], dirs=["initial", "ckpt-000003"])  # a kill mid-write
    live, fd = open_temp(tmp_path / "metrics.jsonl")  # this process: its writer may still be writing
    os.close(fd)
    (tmp_path / "notes.tmp-1").write_text("not ours: no leading dot")
    (tmp_path / f".metrics.jsonl.tmp-{_dead_pid()}").write_text("not ours: a user's name pattern")
    removed = remove_stale_temps(tmp_path, holding_lock=False)
    assert removed == sorted(dead)
    assert live.exists() and (tmp_path / "notes.tmp-1").exists()
    # Holding the lock, no other writer can exist: every temporary of tracerl's is stale; the user's stay.
    assert remove_stale_temps(tmp_path, holding_lock=True) == [live.name]
    assert len(list(tmp_path.iterdir())) == 2


# --- crash-consistent metrics ------------------------------------------------------------------------


def test_metrics_lines_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(metrics_module.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    log = MetricsLog(tmp_path)
    log.write({"step": 1})
    assert len(synced) == 2  # the line, then the folder that gained the file
    log.write({"step": 2})
    log.write({"step": 3})
    assert len(synced) == 4  # one per line


def test_truncation_keeps_steps_up_to_the_checkpoint(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3, 4):
        log.write({"step": step, "loss": float(step)})
    log.truncate_after(2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    log.write({"step": 3, "loss": 30.0})  # the rerun step appends after the kept lines
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_truncation_is_atomic_a_kill_midway_leaves_the_old_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.write({"step": step})
    before = (tmp_path / "metrics.jsonl").read_bytes()

    def killed(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed between writing the new file and swapping it in")

    monkeypatch.setattr(runfolder.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        log.truncate_after(1)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # in-place truncation had left it empty
    monkeypatch.undo()
    assert own_temps(tmp_path) == []  # the interrupted write removed its own temporary


@pytest.mark.parametrize("torn", ['{"step": 3, "lo', '{"step": 3}', '{"step": 3, "lo\n'])
def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path: Path, torn: str) -> None:
    # Cut mid-append: bad JSON, or JSON without its newline, or garbage that reached its newline.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n' + torn)
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3: dropped a torn last line"):
        MetricsLog(tmp_path).truncate_after(5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_damaged_line_before_the_end_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nxx\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON step record"):
        parse_metrics(tmp_path / "metrics.jsonl")


# --- safe loading ------------------------------------------------------------------------------------


class _Payload:
    """Pickles as a call that writes a file: what an attacker would put in a shared run folder."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.write_text, (self.marker, "code ran"))


def test_a_trainer_state_with_a_code_running_pickle_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt-000001"
    folder.mkdir()
    torch.save({"step": 1, "rng": _Payload(tmp_path / "pwned")}, folder / "trainer.pt")
    with pytest.raises(CheckpointError, match=r"trainer.pt holds objects other than tensors and plain data"):
        load_trainer_state(folder)
    assert not (tmp_path / "pwned").exists()
    # The payload is live: the old loader (weights_only=False) would have run it.
    torch.load(folder / "trainer.pt", weights_only=False)
    assert (tmp_path / "pwned").read_text() == "code ran"


def test_trainer_state_round_trips_under_weights_only(tmp_path: Path,
                                                     model_and_tokenizer: tuple[object, object]) -> None:
    model, tokenizer = model_and_tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))  # type: ignore[attr-defined]
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()  # type: ignore[operator]
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    generator = torch.Generator().manual_seed(5)
    random.gauss(0, 1), np.random.normal()  # gauss caches a second value: its state must survive too
    state = {"step": 1, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": RngState.capture(generator).to_dict()}
    folder = save_checkpoint(tmp_path, 1, model, tokenizer, state, "")
    loaded = load_trainer_state(folder)  # weights_only=True inside

    def draws() -> tuple[float, float, float, list[float], list[float]]:
        return (random.random(), random.gauss(0, 1), float(np.random.normal()), torch.rand(2).tolist(),
                torch.rand(2, generator=generator).tolist())

    expected = draws()
    RngState.from_dict(loaded["rng"]).restore(generator)
    assert draws() == expected
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)  # type: ignore[attr-defined]
    fresh.load_state_dict(loaded["optimizer"])
    assert fresh.param_groups[0]["betas"] == (0.9, 0.99)


@pytest.mark.parametrize("pointer", [b"../elsewhere", b"/etc", b"ckpt-000001/../../x", b"ckpt-1",
                                     b"\xff\xfe\x00", b"initial"])
def test_latest_must_name_a_checkpoint_folder_inside_the_run(tmp_path: Path, pointer: bytes) -> None:
    (tmp_path / LATEST).write_bytes(pointer)
    with pytest.raises(CheckpointError, match="LATEST"):
        latest_checkpoint(tmp_path)


def test_latest_may_not_reach_outside_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "trainer.pt").write_bytes(b"")
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt-000001").symlink_to(outside, target_is_directory=True)
    (run / LATEST).write_text("ckpt-000001")
    with pytest.raises(CheckpointError, match="outside"):
        latest_checkpoint(run)


@pytest.mark.parametrize("damaged", ["trainer.pt", "policy/model.safetensors"])
def test_a_truncated_checkpoint_file_is_named(tmp_path: Path, model_and_tokenizer: tuple[object, object],
                                              damaged: str) -> None:
    model, tokenizer = model_and_tokenizer
    folder = save_checkpoint(tmp_path, 1, model, tokenizer, {"step": 1, "w": torch.ones(64)}, "")
    path = folder / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=damaged.split("/")[-1] + " is corrupted"):
        load_trainer_state(folder) if damaged == "trainer.pt" else load_policy_into(model, folder)


def test_non_finite_tensors_are_found_by_name() -> None:
    named = [("a", torch.ones(3)), ("b", torch.tensor([1.0, float("inf")])), ("c", torch.tensor([float("nan")]))]
    assert first_nonfinite(named) == "b"
    assert first_nonfinite(named[:1]) is None


def test_the_console_line_shows_faults_only_when_there_are_some() -> None:
    from tracerl.runs.metrics import console_line

    quiet = console_line({"step": 3, "loss": 0.5, "infra_failed": 0, "nonfinite_skipped_total": 0})
    assert quiet == "step 3  loss=0.500"
    loud = console_line({"step": 4, "loss": 0.5, "infra_failed": 2, "nonfinite_skipped_total": 1})
    assert loud == "step 4  loss=0.500  infra_failed=2  nonfinite_skipped_total=1"
