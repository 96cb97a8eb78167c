"""A run folder may come from someone else: links inside it, bombs in its config.yaml, import
paths, a LATEST that points at a secret, a metrics file that never ends, a checkpoint pruned
while it is read. Each ends in one line and touches nothing outside the folder."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tracerl.runs.checkpoint import CheckpointError, latest_checkpoint
from tracerl.config.schema import ConfigError, resolve_config
from tracerl.runs.metrics import parse_metrics, read_metrics
from tracerl.train.run import resume_training, start_training
from tracerl.runs.run_config import PLUGIN_FIELDS, import_paths, read_run_config
from tracerl.runs.folder import RunFolderError, RunLock, check_run_folder
from helpers_cli import invoke, one_line, smoke_run

SECRET = "SECRET-CONTENT of someone else's file\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
"""Nine levels of nine aliases: 400 bytes that stand for 9**9 (387 million) strings."""


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-step smoke run with a checkpoint (copied by each test that changes it)."""
    return smoke_run(tmp_path_factory.mktemp("untrusted") / "run")


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """A file outside every run folder whose content and mtime must never change."""
    path = tmp_path / "outside" / "sentinel.txt"
    path.parent.mkdir()
    path.write_text(SECRET)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def untouched(path: Path) -> bool:
    return path.read_text() == SECRET and path.stat().st_mtime_ns == 1_000_000_000


# --- item 1: a .lock that is a link ------------------------------------------------------


def test_a_lock_link_never_truncates_its_target(tmp_path: Path, sentinel: Path) -> None:
    folder = tmp_path / "fresh"
    folder.mkdir()
    (folder / ".lock").symlink_to(sentinel)
    with pytest.raises(RunFolderError, match=r"\.lock is a symbolic link"):
        RunLock(folder)
    with pytest.raises(RunFolderError, match=r"\.lock is a symbolic link"):
        start_training("grpo", folder, smoke="random")
    assert untouched(sentinel)


def test_a_dangling_lock_link_creates_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "fresh"
    folder.mkdir()
    (folder / ".lock").symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(RunFolderError, match="symbolic link"):
        RunLock(folder)
    assert not (tmp_path / "created-elsewhere").exists()


def test_resume_refuses_a_lock_link(run: Path, sentinel: Path) -> None:
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(sentinel)
    one_line(invoke("train", "--resume", str(run)), "train failed:", ".lock", "symbolic link")
    assert untouched(sentinel)


# --- item 4: links inside the run folder -------------------------------------------------


def test_a_dangling_metrics_link_is_refused_on_a_fresh_start(tmp_path: Path) -> None:
    folder, elsewhere = tmp_path / "fresh", tmp_path / "elsewhere.jsonl"
    folder.mkdir()
    (folder / "metrics.jsonl").symlink_to(elsewhere)
    result = invoke("train", "grpo", "--smoke-random", "--steps", "1", "--out", str(folder))
    one_line(result, "metrics.jsonl", "symbolic link")
    assert not elsewhere.exists()


def test_a_rollouts_link_is_refused_before_resume_prunes_it(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "theirs"
    target.mkdir()
    (target / "step-000009.jsonl.gz").write_bytes(b"keep me")
    (target / ".tmp-view").mkdir()
    shutil.rmtree(run / "rollouts")
    (run / "rollouts").symlink_to(target)
    with pytest.raises(RunFolderError, match="rollouts is a symbolic link"):
        resume_training(run, steps=2)
    assert (target / "step-000009.jsonl.gz").read_bytes() == b"keep me" and (target / ".tmp-view").is_dir()


@pytest.mark.parametrize("entry", ["metrics.jsonl", "ckpt-000001/trainer.pt", "ckpt-000001/config.yaml",
                                   "initial/config.json", "config.yaml"])
def test_a_link_anywhere_in_the_folder_is_refused(run: Path, sentinel: Path, entry: str) -> None:
    (run / entry).unlink()
    (run / entry).symlink_to(sentinel)
    with pytest.raises(RunFolderError, match=f"{entry} is a symbolic link"):
        check_run_folder(run)
    one_line(invoke("train", "--resume", str(run), "--steps", "2"), "symbolic link")
    one_line(invoke("eval", "--run", str(run), "--limit", "1", "--no-progress"), "symbolic link")
    assert untouched(sentinel)


def test_a_fifo_in_the_folder_is_refused(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(RunFolderError, match="not a regular file"):
        check_run_folder(run)


# --- item 13: bounded metrics reads --------------------------------------------------------


def test_metrics_linked_to_dev_zero_is_refused_at_once(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    started = time.monotonic()
    with pytest.raises(RunFolderError, match="metrics.jsonl is a symbolic link"):
        resume_training(run)
    with pytest.raises(ValueError, match="symbolic link"):
        read_metrics(run)
    assert time.monotonic() - started < 5


def test_a_huge_metrics_line_is_damage_not_a_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' + b"x" * (3 << 20) + b"\n" + b'{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: line longer than 1 MiB"):
        parse_metrics(path)
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3')  # a torn last line is still dropped
    assert [r["step"] for r in parse_metrics(path)] == [1, 2]


# --- item 10: LATEST never echoes what it points at --------------------------------------


def test_latest_link_is_refused_without_echoing_its_target(run: Path, sentinel: Path) -> None:
    (run / "LATEST").unlink()
    (run / "LATEST").symlink_to(sentinel)
    with pytest.raises(CheckpointError) as caught:
        latest_checkpoint(run)
    assert "SECRET" not in str(caught.value) and "not a plain file" in str(caught.value)
    line = one_line(invoke("eval", "--run", str(run), "--no-progress"), "LATEST")
    assert "SECRET" not in line


def test_latest_with_foreign_content_is_not_echoed(run: Path) -> None:
    (run / "LATEST").write_text(SECRET)
    with pytest.raises(CheckpointError, match="does not hold a checkpoint name") as caught:
        latest_checkpoint(run)
    assert "SECRET" not in str(caught.value)


# --- item 5: YAML bombs --------------------------------------------------------------------


def test_an_alias_bomb_config_is_refused_in_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    started = time.monotonic()
    one_line(invoke("config", "show", "grpo", "--config", str(bomb)), "bomb.yaml", "alias bomb")
    one_line(invoke("train", "grpo", "--smoke-random", "--config", str(bomb), "--out", str(tmp_path / "r")), "alias bomb")
    assert time.monotonic() - started < 20 and not (tmp_path / "r").exists()


def test_anchors_of_ordinary_size_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("optim: &o {lr: &lr 0.002, weight_decay: *lr}\n")
    optim = resolve_config("grpo", config_file=path, smoke="random").optim
    assert optim.lr == 0.002 and optim.weight_decay == 0.002


def test_a_run_folder_config_bomb_is_refused_on_resume_and_eval(run: Path) -> None:
    for path in (run / "config.yaml", run / "ckpt-000001" / "config.yaml"):
        path.write_text(BOMB)
    with pytest.raises(ConfigError, match="alias bomb"):
        resume_training(run)
    one_line(invoke("eval", "--run", str(run), "--no-progress"), "config.yaml", "alias bomb")


def test_deeply_nested_yaml_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    one_line(invoke("config", "show", "grpo", "--config", str(deep)), "deep.yaml", "nested deeper")


# --- item 2: --config inside --out ----------------------------------------------------------


def test_config_inside_the_run_folder_is_refused_and_kept(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    mine = "# my experiment\nsteps: 1\n"
    (exp / "config.yaml").write_text(mine)
    result = invoke("train", "grpo", "--smoke-random", "--config", str(exp / "config.yaml"), "--out", str(exp))
    one_line(result, "--config", "outside --out")
    assert (exp / "config.yaml").read_text() == mine and sorted(p.name for p in exp.iterdir()) == ["config.yaml"]


# --- item 11: no import of code the run folder names -----------------------------------------


@pytest.fixture
def hostile_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module that, imported, leaves a mark (a verifier shipped inside an archive)."""
    marker = tmp_path / "imported.txt"
    package = tmp_path / "shipped"
    package.mkdir()
    (package / "run_plugin.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "def verify(answer, task):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(package))
    return marker


def test_import_paths_in_a_run_config_need_trust(run: Path, hostile_module: Path) -> None:
    for path in (run / "config.yaml", run / "ckpt-000001" / "config.yaml"):
        path.write_text(path.read_text().replace("verifier: em", "verifier: run_plugin:verify"))
    with pytest.raises(RunFolderError, match=r"data.verifier = 'run_plugin:verify'.*--trust-run-code"):
        resume_training(run)
    one_line(invoke("eval", "--run", str(run), "--no-progress"), "data.verifier", "--trust-run-code")
    assert not hostile_module.exists()
    config = read_run_config(run / "config.yaml", trust_code=True)  # the user's explicit opt-in
    assert config.data.verifier == "run_plugin:verify" and hostile_module.read_text() == "ran"


def test_every_plugin_field_is_scanned() -> None:
    data = {"data": {"verifier": "a.b:c", "environment": "search", "tools": ["t.u:v", "w.x:y"]},
            "model": {"format": "m.n:o", "system_prompt": "Answer: briefly"},
            "rollout": {"scheme": "s.t:u"}, "algo": {"estimator": "e.f:g"}}
    found = import_paths(data)
    assert [field for field, _ in found] == ["data.verifier", "data.tools", "data.tools", "model.format",
                                             "rollout.scheme", "algo.estimator"]
    assert set(PLUGIN_FIELDS) >= {field for field, _ in found}


# --- item 16: eval on a live run whose checkpoint is pruned ------------------------------


def _prune_on_load(run: Path, monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Make the first ``times`` model loads find their checkpoint pruned by a 'live run'."""
    import tracerl.testbed.loading as loading

    real, seen = loading.load_model, []

    def racing(path: str, **kwargs):  # noqa: ANN003, ANN202
        if len(seen) < times:
            current = Path(path).parent
            step = int(current.name.split("-")[1]) + 1
            shutil.copytree(current, run / f"ckpt-{step:06d}")
            (run / "LATEST").write_text(f"ckpt-{step:06d}")
            shutil.rmtree(current)  # keep_last=1 pruned the one we were reading
        seen.append(Path(path).parent.name)
        return real(path, **kwargs)

    monkeypatch.setattr(loading, "load_model", racing)
    return seen


def test_eval_reads_the_new_checkpoint_when_the_live_run_prunes_it(run: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.train.evaluation import load_run_policy

    seen = _prune_on_load(run, monkeypatch, times=1)
    *_, folder = load_run_policy(run, "cpu")
    assert folder.name == "ckpt-000002" and seen == ["ckpt-000001", "ckpt-000002"]


def test_eval_says_in_one_line_when_the_checkpoint_keeps_moving(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _prune_on_load(run, monkeypatch, times=10)
    one_line(invoke("eval", "--run", str(run), "--no-progress"), "moved while it was read", "ckpt-000001")


def test_files_the_run_does_not_own_are_left_alone(run: Path, tmp_path: Path) -> None:
    (run / "wandb").mkdir()
    (run / "wandb" / "latest-run").symlink_to(run / "wandb")  # what wandb.init(dir=RUN_DIR) writes
    (run / "my_data").symlink_to(tmp_path)  # the user's own link beside the run
    check_run_folder(run)
    (run / "ckpt-000001" / "policy" / "extra").symlink_to(tmp_path)  # inside a run entry: refused
    with pytest.raises(RunFolderError, match="policy/extra is a symbolic link"):
        check_run_folder(run)
