"""The ``dist`` section is checked at config load; the one-process path never loads the sharded code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError
from tracerl.distributed.launch import without_nproc

ROOT = Path(__file__).parent.parent.parent


@pytest.mark.parametrize("override, message", [
    ("dist.nproc=0", "dist.nproc must be an integer >= 1"),
    ("dist.backend=mpi", "dist.backend = 'mpi' is not valid; allowed values: auto, gloo, nccl"),
    ("dist.backend=nccl", "dist.backend = 'nccl' needs model.device = 'cuda'"),
    ("dist.timeout_s=0", "dist.timeout_s must be > 0"),
    ("dist.mixed_precision=fp8", "dist.mixed_precision = 'fp8' is not valid; allowed values: auto, bf16, fp32"),
])
def test_bad_dist_values_name_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_config("grpo", overrides=[override])


def test_lora_with_several_processes_is_refused() -> None:
    pytest.importorskip("peft")  # LoraConfig itself needs peft
    with pytest.raises(ConfigError, match="dist.nproc = 2 does not work with a LoRA adapter"):
        resolve_config("grpo", overrides=["dist.nproc=2", "model.lora.r=4"])


def test_mixed_precision_follows_the_model_dtype() -> None:
    config = resolve_config("grpo", overrides=["dist.nproc=2", "model.dtype=bfloat16"])
    assert config.dist.fsdp_dtype(config.model.dtype) == "bfloat16"
    config = resolve_config("grpo", overrides=["dist.nproc=2", "dist.mixed_precision=fp32", "model.dtype=bfloat16"])
    assert config.dist.fsdp_dtype(config.model.dtype) == "float32"
    assert resolve_config("grpo").dist.fsdp_dtype("float32") == "float32"


def test_relaunch_drops_nproc_for_torchrun() -> None:
    assert without_nproc(["train", "grpo", "--nproc", "2", "--out", "r"]) == ["train", "grpo", "--out", "r"]
    assert without_nproc(["train", "--nproc=4", "--resume", "r"]) == ["train", "--resume", "r"]


LEAVE = ("import atexit, sys; from tracerl.distributed.launch import leave_rank\n"
         "atexit.register(lambda: print('atexit ran', flush=True))\n"
         "class Finaliser:\n"
         "    def __del__(self): print('finalised')\n"
         "kept = Finaliser()\n"
         "sys.stdout.write('unflushed'); leave_rank({code!r})")


@pytest.mark.parametrize("code, rc", [(None, 0), (3, 3), ("stopped: why", 1)])
def test_a_rank_leaves_after_atexit_without_finalising(code: object, rc: int) -> None:
    done = subprocess.run([sys.executable, "-c", LEAVE.format(code=code)], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == rc
    assert done.stdout == "unflushedatexit ran\n"  # the module-level object is never finalised
    assert done.stderr == ("stopped: why\n" if isinstance(code, str) else "")


DIST_MODULES = ("torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.distributed.tensor", "ray",
                "tracerl.distributed.update", "tracerl.distributed.trainer", "tracerl.runs.sharded",
                "tracerl.distributed.fsdp")
SHOW = f"import sys; print('LOADED', sorted(m for m in sys.modules if m.startswith({DIST_MODULES!r})))"


def _loaded(script: str, home: Path) -> set[str]:
    done = subprocess.run([sys.executable, "-c", script + "\n" + SHOW], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1",
                               "PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("LOADED ")][-1]
    return set(eval(line[len("LOADED "):]))  # a printed list of module names


def test_one_process_run_never_imports_the_sharded_path(tmp_path: Path) -> None:
    """A one-process run (train, checkpoint, resume) in a fresh interpreter loads no sharded code
    and no Ray. transformers' modeling_utils itself imports parts of torch.distributed.checkpoint and
    fsdp (5.x); the run may load those, and nothing of them beyond."""
    baseline = _loaded("import transformers.modeling_utils", tmp_path)
    run = str(tmp_path / "run")
    loaded = _loaded(f"""
from tracerl.train.run import resume_training, start_training
extra = ["eval.every=0", "eval.size=2", "rollout.budget=4", "rollout.pool_size=2"]
start_training("grpo", {run!r}, overrides=extra, steps=1, smoke="random")()
resume_training({run!r}, steps=2)()
import tracerl.cli
""", tmp_path)
    assert (tmp_path / "run" / "ckpt-000002").is_dir()
    assert not {m for m in loaded if m.startswith(("ray", "tracerl."))}
    assert loaded <= baseline, sorted(loaded - baseline)
    assert "torch.distributed.checkpoint.state_dict" not in loaded  # what runs/sharded.py needs


def test_bad_nproc_runs_fail_in_one_line_before_any_launch(tmp_path: Path) -> None:
    """Checked in this process before torchrun would start: one stderr line, exit 1, no folder."""
    from typer.testing import CliRunner

    from tracerl.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(out), "--nproc", "2",
                                      "--set", "dist.backend=nccl"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "dist.backend = 'nccl' needs model.device = 'cuda'" in lines[0], result.stderr
    assert not out.exists()
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--out", str(out), "--nproc", "0"])
    assert result.exit_code == 2 and "--nproc must be >= 1" in result.stderr


def test_a_one_process_checkpoint_is_not_resumed_at_two(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tracerl.cli import app
    from tracerl.train.run import start_training

    run = tmp_path / "run"
    start_training("grpo", run, overrides=["eval.every=0", "eval.size=2", "rollout.budget=4", "rollout.pool_size=2"],
                   steps=1, smoke="random")()
    result = CliRunner().invoke(app, ["train", "--resume", str(run), "--nproc", "2"])
    assert result.exit_code == 1, result.output
    assert "was written by one process" in result.stderr and "--nproc 1" in result.stderr
