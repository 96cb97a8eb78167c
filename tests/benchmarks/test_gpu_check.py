"""The GPU check says clearly when there is no GPU (it runs for real only where one is lent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run benchmarks/gpu/gpu_check.py itself")
def test_gpu_check_without_a_gpu_exits_2_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA GPU found" in proc.stderr
    assert not out.exists()


def test_cpu_dry_run_of_the_shape_checks_writes_every_section(tmp_path: Path) -> None:
    """``--device cpu --small`` (the presets and resume sections skipped: they are the trainer's
    own tests): each section passes, the JSON says it is complete, and the packed update is timed
    after a warm-up of each mode, over alternating rounds."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_check.py"), "--device", "cpu", "--small",
                           "--dtype", "float32", "--skip", "presets", "--skip", "resume", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["complete"] and report["ok"]
    assert {"scorer", "engine", "update", "packed_update"} <= set(report) and "presets" not in report
    packed = report["packed_update"]
    assert packed["always"]["update_forward_tokens"] < packed["never"]["update_forward_tokens"]
    assert all(len(packed[mode]["round_seconds"]) == packed["repeats"] == 3 for mode in ("never", "always"))
    assert packed["gradient_relative_gap"] < 1e-4
