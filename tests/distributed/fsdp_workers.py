"""Worker side of the FSDP tests, run under torchrun: ``fsdp_workers.py OUT`` (every scenario, one launch).

Each scenario writes rank 0's full (gathered) state dict and metrics to ``OUT`` for the test
process to compare with the one-process run.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_cases import CASES, advantages, optimizer, settings, tiny_policy, trajectories  # noqa: E402

from tracerl.runs.sharded import load_sharded, save_sharded  # noqa: E402
from tracerl.distributed.update import plan_update, sharded_policy_update, sharded_trainer_logprobs  # noqa: E402
from tracerl.distributed.fsdp import full_state_dict, init_distributed, scatter_shares  # noqa: E402
from tracerl.distributed.shard_load import (  # noqa: E402
    build_sharded, local_bytes, sharded_from_folder, whole_load_reason)

torch.set_num_threads(1)
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")


def _step(model, opt, reference, case: str, recompute: bool = False, packing: str = "never") -> dict[str, float]:
    tied, kl, signal = CASES[case]
    world, rank = dist.get_world_size(), dist.get_rank()
    base = tiny_policy(tied)  # the inputs are built from the initial weights on every rank alike
    trajs = trajectories(base, tree=packing != "never")
    plan = settings(kl, packing=packing)
    shares = plan_update(trajs, advantages(trajs, signal), plan, reference is not None, world) \
        if rank == 0 else None
    share = scatter_shares(shares)
    metrics: dict[str, float] = {}
    if recompute:
        (share,), metrics = sharded_trainer_logprobs(model, [share], plan, pad_id=0)
    metrics.update(sharded_policy_update(model, opt, share, plan, pad_id=0, reference=reference))
    return metrics


def _initial(tied: bool) -> Path:
    """The initial policy's folder (safetensors), written once by rank 0, as a run's ``initial/``."""
    folder = OUT / f"initial_{'tied' if tied else 'untied'}"
    if dist.get_rank() == 0 and not folder.exists():
        tiny_policy(tied).save_pretrained(folder)
    dist.barrier()
    return folder


def _sharded(case: str, mesh):
    """Policy and reference as the trainer's ranks build them: on the meta device, each rank reading its rows."""
    tied, kl, _ = CASES[case]
    model = sharded_from_folder(_initial(tied), mesh, "float32", "cpu")
    reference = sharded_from_folder(_initial(tied), mesh, "float32", "cpu").requires_grad_(False) if kl > 0 else None
    return model, optimizer(model), reference


def shard_loading(out: Path, mesh) -> None:
    """What each rank holds after loading (its bytes against the whole model's), and the gathered weights."""
    for tied in (True, False):
        model = sharded_from_folder(_initial(tied), mesh, "float32", "cpu")
        box = [None] * dist.get_world_size()
        dist.all_gather_object(box, local_bytes(model))
        whole = sum(p.numel() * p.element_size() for p in tiny_policy(tied).parameters())
        _dump(out, f"loaded_{'tied' if tied else 'untied'}", model, {"rank_bytes": box, "whole_bytes": whole})
    # a folder whose weights are not safetensors: each rank loads it whole, then shards it, and says why
    folder = OUT / "initial_bin"
    if dist.get_rank() == 0:
        policy = tiny_policy(False)
        policy.config.save_pretrained(folder)
        torch.save(policy.state_dict(), folder / "pytorch_model.bin")
    dist.barrier()
    reason = whole_load_reason(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_sharded(folder, mesh, "float32", "cpu", reason=reason)
    _dump(out, "loaded_bin", model, {"reason": reason, "warnings": [str(w.message) for w in caught
                                                                     if "loads the whole model" in str(w.message)]})


def _dump(out: Path, name: str, model, metrics: dict[str, float]) -> None:
    state = full_state_dict(model)
    if dist.get_rank() == 0:
        torch.save(state, out / f"{name}.pt")
        (out / f"{name}.json").write_text(json.dumps(metrics))


def update(out: Path, mesh) -> None:
    for case in CASES:
        model, opt, reference = _sharded(case, mesh)
        _dump(out, case, model, _step(model, opt, reference, case))
    model, opt, reference = _sharded("tied_kl", mesh)
    _dump(out, "recompute", model, _step(model, opt, reference, "tied_kl", recompute=True))
    model, opt, reference = _sharded("tied_kl", mesh)
    _dump(out, "packed", model, _step(model, opt, reference, "tied_kl", recompute=True, packing="always"))
    _nonfinite(out, mesh)


def _nonfinite(out: Path, mesh) -> None:
    """A NaN old log-prob on a row only rank 1 trains: the reduced loss is NaN, so both ranks skip."""
    model, opt, _ = _sharded("tied_nokl", mesh)
    trajs = trajectories(tiny_policy(True))
    advs = advantages(trajs, None)
    trajs[4].turns[0].logprobs[0] = float("nan")  # by length: [0, 3] [1, 4] [2, 5]; [1, 4] is rank 1's
    shares = plan_update(trajs, advs, settings(0.0), False, dist.get_world_size()) if dist.get_rank() == 0 else None
    share = scatter_shares(shares)
    held = any(t.task_id == "4" for rows in share.rounds for t, _ in rows)
    metrics = sharded_policy_update(model, opt, share, settings(0.0), pad_id=0)
    metrics[f"rank{dist.get_rank()}_holds_nan_row"] = float(held)
    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, metrics)
    _dump(out, "nonfinite", model, {k: v for m in box for k, v in m.items() if k.startswith("rank")}
          | {"skipped": [m["nonfinite_skipped"] for m in box]})


def checkpoint(out: Path, mesh) -> None:
    """Step 1, save (DCP), step 2 uninterrupted; then a fresh sharded run loads and does step 2."""
    model, opt, reference = _sharded("untied_kl", mesh)
    _step(model, opt, reference, "untied_kl")
    save_sharded(out / "dcp", model, opt)
    _dump(out, "after_1", model, {})
    _dump(out, "uninterrupted_2", model, _step(model, opt, reference, "untied_kl"))
    model, opt, reference = _sharded("untied_kl", mesh)
    load_sharded(out / "dcp", model, opt)
    _dump(out, "resumed_2", model, _step(model, opt, reference, "untied_kl"))


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    device_mesh = init_distributed("gloo", "cpu", timeout_s=120)
    try:
        shard_loading(folder, device_mesh)
        update(folder, device_mesh)
        checkpoint(folder, device_mesh)
    finally:
        dist.destroy_process_group()
