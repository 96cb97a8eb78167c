"""FSDP2 on gloo, 2 processes: the sharded update equals one process; DCP resumes across process counts.

One torchrun launch for the whole module (every scenario of fsdp_workers.py). Run with
``make test-dist`` (sets TRACERL_DIST_TESTS=1); the default suite skips this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdp_cases import CASES, advantages, optimizer, settings, tiny_policy, trajectories
from tracerl.train.update import policy_update, with_trainer_logprobs

pytestmark = [pytest.mark.dist, pytest.mark.skipif(os.environ.get("TRACERL_DIST_TESTS") != "1",
                                                   reason="multi-process test: run with `make test-dist`")]
HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _launch(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRACERL_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "fsdp_workers.py"), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def update_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    _launch(out)
    return out


@pytest.fixture(scope="module")
def checkpoint_out(update_out: Path) -> Path:
    return update_out


def _one_process(case: str, steps: int = 1, recompute: bool = False,
                 tree: bool = False) -> tuple[torch.nn.Module, dict[str, float]]:
    tied, kl, signal = CASES[case]
    model, reference = tiny_policy(tied), (tiny_policy(tied) if kl > 0 else None)
    opt, metrics = optimizer(model), {}
    trajs = trajectories(tiny_policy(tied), tree=tree)
    for _ in range(steps):
        rows = trajs
        if recompute:
            rows, metrics = with_trainer_logprobs(model, trajs, settings(kl), pad_id=0)
        metrics.update(policy_update(model, opt, rows, advantages(trajs, signal), settings(kl), 0, reference))
    return model, metrics


def _assert_same_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    ours = model.state_dict()
    assert set(state) <= set(ours) and len(state) >= len(list(model.parameters()))
    for name, value in state.items():
        assert torch.allclose(ours[name], value, atol=atol, rtol=0), (name, (ours[name] - value).abs().max())


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_equal_one_process(update_out: Path, case: str) -> None:
    model, metrics = _one_process(case)
    _assert_same_weights(model, torch.load(update_out / f"{case}.pt"))
    theirs = json.loads((update_out / f"{case}.json").read_text())
    assert theirs["nonfinite_skipped"] == 0.0
    for key in ("loss", "kl", "clip_fraction", "grad_norm", "trained_tokens"):
        assert theirs[key] == pytest.approx(metrics[key], abs=1e-6), key
    # the step moved every weight (the comparison above is not between two untouched models)
    start = tiny_policy(CASES[case][0]).state_dict()
    moved = [name for name, value in model.named_parameters() if not torch.equal(value, start[name])]
    assert len(moved) == len(list(model.parameters()))


def test_one_signal_row_trains_it_alone(update_out: Path) -> None:
    """One micro-batch for two ranks: rank 1 ran a padding round (no hang) and the tokens are row 2's."""
    theirs = json.loads((update_out / "one_signal_row.json").read_text())
    trajs = trajectories(tiny_policy(True))
    assert theirs["trained_tokens"] == sum(trajs[2].sampled)


def test_recomputed_old_logprobs_on_the_same_plan(update_out: Path) -> None:
    model, metrics = _one_process("tied_kl", recompute=True)
    _assert_same_weights(model, torch.load(update_out / "recompute.pt"))
    theirs = json.loads((update_out / "recompute.json").read_text())
    assert theirs["logprob_mismatch_mean_abs"] == pytest.approx(metrics["logprob_mismatch_mean_abs"], abs=1e-6)
    assert theirs["logprob_mismatch_max"] == pytest.approx(metrics["logprob_mismatch_max"], abs=1e-6)
    assert theirs["logprob_mismatch_max"] > 0.1  # the shifted sampler log-probs (0.3 * sin) show


def test_packed_trees_on_two_ranks_equal_one_process_unpacked(update_out: Path) -> None:
    """Tree packing on the FSDP path (recomputed old log-probs and the KL term packed too): the
    same step as one process training every leaf on its own."""
    model, metrics = _one_process("tied_kl", recompute=True, tree=True)
    _assert_same_weights(model, torch.load(update_out / "packed.pt"), atol=1e-5)
    theirs = json.loads((update_out / "packed.json").read_text())
    for key in ("loss", "kl", "grad_norm", "trained_tokens"):
        assert theirs[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
    assert theirs["update_forward_tokens"] < metrics["update_forward_tokens"]  # shared turns forwarded once


def test_a_nonfinite_row_on_one_rank_makes_every_rank_skip(update_out: Path) -> None:
    report = json.loads((update_out / "nonfinite.json").read_text())
    assert report["rank1_holds_nan_row"] == 1.0 and report["rank0_holds_nan_row"] == 0.0
    assert report["skipped"] == [1.0, 1.0]
    _assert_same_weights(tiny_policy(True), torch.load(update_out / "nonfinite.pt"), atol=0)  # nothing stepped


def test_resume_at_two_ranks_equals_the_uninterrupted_run(checkpoint_out: Path) -> None:
    uninterrupted = torch.load(checkpoint_out / "uninterrupted_2.pt")
    resumed = torch.load(checkpoint_out / "resumed_2.pt")
    for name, value in uninterrupted.items():
        assert torch.allclose(resumed[name], value, atol=1e-7, rtol=0), name
    assert json.loads((checkpoint_out / "resumed_2.json").read_text()) == \
        pytest.approx(json.loads((checkpoint_out / "uninterrupted_2.json").read_text()), abs=1e-7)


def test_resume_at_one_process_equals_the_uninterrupted_run(checkpoint_out: Path) -> None:
    """The checkpoint saved by two ranks loads into a plain model and AdamW in this process (no
    process group); its next step equals the two-rank uninterrupted step and the one-process run."""
    from tracerl.runs.sharded import load_sharded

    tied, kl, signal = CASES["untied_kl"]
    model, reference = tiny_policy(tied), tiny_policy(tied)
    opt = optimizer(model)
    load_sharded(checkpoint_out / "dcp", model, opt)
    _assert_same_weights(model, torch.load(checkpoint_out / "after_1.pt"), atol=0)
    assert len(opt.state) == len(list(model.parameters()))  # AdamW moments came back too
    trajs = trajectories(tiny_policy(tied))
    policy_update(model, opt, trajs, advantages(trajs, signal), settings(kl), 0, reference)
    _assert_same_weights(model, torch.load(checkpoint_out / "uninterrupted_2.pt"))
    two_steps, _ = _one_process("untied_kl", steps=2)
    _assert_same_weights(two_steps, torch.load(checkpoint_out / "uninterrupted_2.pt"))


@pytest.mark.parametrize("tied", [True, False])
def test_each_rank_reads_only_its_shard(update_out: Path, tied: bool) -> None:
    """Built on the meta device, each rank holds its rows of every weight (plus the replicated
    rotary buffers), and the gathered weights are the folder's, bit for bit."""
    name = "tied" if tied else "untied"
    whole = tiny_policy(tied)
    _assert_same_weights(whole, torch.load(update_out / f"loaded_{name}.pt"), atol=0)
    report = json.loads((update_out / f"loaded_{name}.json").read_text())
    buffers = sum(b.numel() * b.element_size() for b in whole.buffers())
    assert report["whole_bytes"] == sum(p.numel() * p.element_size() for p in whole.parameters())
    assert sum(report["rank_bytes"]) == report["whole_bytes"] + 2 * buffers  # shards add up; buffers on each
    assert max(report["rank_bytes"]) < 0.6 * report["whole_bytes"]


def test_weights_that_are_not_safetensors_load_whole_with_a_warning(update_out: Path) -> None:
    report = json.loads((update_out / "loaded_bin.json").read_text())
    assert "no model.safetensors" in report["reason"]
    assert len(report["warnings"]) == 1 and report["reason"] in report["warnings"][0]
    _assert_same_weights(tiny_policy(False), torch.load(update_out / "loaded_bin.pt"), atol=0)
