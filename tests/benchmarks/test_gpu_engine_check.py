"""The GPU engine check's CPU dry run (``--device cpu --small``): every section runs or says why it
is skipped, the JSON is complete, and the fast engine's greedy tokens equal the bf16 eager engine's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "gpu_engine_check.py"


def test_cpu_dry_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu_engine_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["complete"] and report["ok"]
    sections = ("eager_profile", "bf16_eager", "hf_generate", "static", "exactness", "packed_update",
                "hf_generate_static_compile")
    assert all(name in report and "error" not in report[name] for name in sections)
    assert report["eager_profile"]["profile"]["steps"] == 10
    assert set(report["bf16_eager"]) >= {"8", "16"} and set(report["static"]) >= {"8", "16", "async_8", "profile"}
    assert report["static"]["compiled"] is False  # CUDA graphs only on CUDA: the CPU runs the same path eagerly
    assert report["static"]["8"]["generated_tokens"] == 8 * 8  # no stop strings: every row to the cap
    exact = report["exactness"]
    assert exact["greedy_rows_identical"] == exact["rows"] == 8 and exact["greedy_token_agreement"] == 1.0
    assert exact["teacher_forced"]["max_abs"] < 0.05 and exact["teacher_forced"]["trainer_argmax_agreement"] >= 0.99
    packed = report["packed_update"]
    assert packed["128"]["always"]["update_forward_tokens"] < packed["128"]["never"]["update_forward_tokens"]
    assert "skipped" in packed["4096"] and "CUDA" in report["hf_generate_static_compile"]["skipped"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the check itself")
def test_without_a_gpu_it_exits_2_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "gpu_engine_check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU found" in proc.stderr and not out.exists()
