"""``tracerl train --nproc 2`` with Ray rollout workers: rank 0 keeps no whole policy.

The workers get the weights streamed from the FSDP shards after each update, and each
checkpoint's ``policy/`` is written from them bucket by bucket; the run equals one process with
the same Ray workers, and resumes exactly. Run with ``make test-dist``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_fsdp_train import SMOKE, _metrics, _rewound, _tracerl

pytestmark = [pytest.mark.dist, pytest.mark.skipif(os.environ.get("TRACERL_DIST_TESTS") != "1",
                                                   reason="multi-process test: run with `make test-dist`")]
RAY = ["--set", "rollout.executor=ray", "--set", "rollout.workers=2", "--set", "rollout.readiness_on=workers",
       "--set", "rollout.request_timeout_s=120"]


def _policy(run: Path, step: int) -> dict[str, torch.Tensor]:
    """A checkpoint's policy/ weights, one safetensors file or a sharded checkpoint's files."""
    folder = run / f"ckpt-{step:06d}" / "policy"
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return load_file(folder / "model.safetensors")
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return {k: v for f in files for k, v in load_file(folder / f).items()}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("streamed") / "run"
    _tracerl(*SMOKE, *RAY, "--out", str(run), "--nproc", "2")
    return run


def _same(ours: Path, theirs: Path, step: int, rel: float) -> None:
    a, b = _metrics(ours)[step - 1], _metrics(theirs)[step - 1]
    for key in ("reward_mean", "generated_tokens", "trained_tokens"):
        assert a[key] == b[key], key
    for key in ("loss", "kl", "grad_norm"):
        assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-6), key
    wa, wb = _policy(ours, step), _policy(theirs, step)
    assert wa.keys() <= wb.keys() and len(wa) >= len(wb) - 1  # a tied head is written once
    for name in wa:  # AdamW's first steps move each weight by about lr = 3e-4 whatever its gradient's size,
        # so a near-zero gradient summed in another order can move one element by up to 2 lr
        assert torch.allclose(wa[name], wb[name], atol=1e-4, rtol=0), name
        assert (wa[name] - wb[name]).abs().median() < 1e-6, name


def test_ray_workers_beside_two_ranks_train_as_one_process(streamed: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    _tracerl(*SMOKE, *RAY, "--out", str(one))  # the same two workers, sent the one process's whole policy
    policy = streamed / "ckpt-000003" / "policy"
    assert (policy / "model.safetensors.index.json").is_file()  # written from the shards, bucket by bucket
    assert (streamed / "ckpt-000003" / "dcp" / ".metadata").is_file()
    metrics = _metrics(streamed)
    assert all(m["sync_bytes"] > 0 for m in metrics)  # the workers were sent every update
    for step in (1, 2, 3):
        _same(streamed, one, step, rel=1e-4)


def test_a_streamed_run_resumes_exactly(streamed: Path, tmp_path: Path) -> None:
    run = _rewound(streamed, tmp_path / "resumed", step=2)
    _tracerl("--resume", str(run), "--nproc", "2")
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]
    _same(run, streamed, 3, rel=1e-6)


def test_the_loaded_policy_folder_is_a_transformers_checkpoint(streamed: Path) -> None:
    """What `eval --run` and vLLM read: transformers loads the bucketed policy/ as it loads any."""
    code = ("import sys; from transformers import AutoModelForCausalLM; "
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); print(sum(p.numel() for p in m.parameters()))")
    done = subprocess.run([sys.executable, "-c", code, str(streamed / "ckpt-000003" / "policy")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0
