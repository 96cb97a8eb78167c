"""The distributed GPU check says clearly when there is no GPU, and its CPU dry run passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "gpu_check_dist.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run benchmarks/gpu/gpu_check_dist.py itself")
def test_without_a_gpu_it_exits_2_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check_dist.json"
    proc = _run("--out", str(out))
    assert proc.returncode == 2
    assert "no CUDA GPU found" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_dry_run_passes_on_the_cpu(tmp_path: Path) -> None:
    """gloo at world size 1, a small model, shared memory instead of CUDA IPC (one spawned process)."""
    out = tmp_path / "gpu_check_dist.json"
    proc = _run("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["setup"]["backend"] == "gloo"
    assert report["fsdp"]["relative_gap"] < 0.05 and report["fsdp"]["parameters"] > 0
    assert report["ipc"]["equal_weights"] and report["ipc"]["transport"] == "cpu_shared_memory"
    assert report["dcp"]["equal_weights"] and report["dcp"]["equal_optimizer"]
    assert report["shard_load"]["equal_to_saved"] and report["shard_load"]["shard_gb"] > 0
    assert report["complete"] and report["ok"]
