"""GPU check of the distributed pieces on one GPU: FSDP2 at world size 1 on NCCL, a CUDA-IPC weight
push between two processes, DCP save/load on CUDA. No Ray, no vLLM, nothing downloaded.

    python benchmarks/gpu/gpu_check_dist.py [--out benchmarks/results/gpu_check_dist.json]

A few minutes on one H200. Without CUDA it says so and exits 2; ``--dry-run`` runs the same
checks on the CPU (gloo, a small model, shared memory instead of CUDA IPC): what the tests do.

Sections (stable keys in the JSON):

- ``fsdp``: a random model of Qwen3-0.6B's shape (``--dry-run``: small), ``fully_shard`` per layer
  and root with bf16 parameters and float32 gradient reduction; one sharded update against the
  unsharded update (bf16 autocast) of the same batch, with SGD at lr 1 so the weight change is the
  gradient: ``relative_gap`` = |change_fsdp - change_plain| / |change_plain| (bf16 tolerance 0.05).
  Peak memory per phase (shard, update, gather).
- ``ipc``: the policy's weights pushed to a second process on the same GPU through CUDA IPC
  (torch.multiprocessing), copied there: GB/s of the second push, equal checksums.
- ``dcp``: the sharded model and its AdamW state saved with torch.distributed.checkpoint and loaded
  into a fresh sharded model: equal weights and optimiser state, seconds, size on disk.
- ``sync_buckets``: the sharded policy streamed as the Ray weight sync builds it
  (``weight_buckets`` in bf16, 256 MiB buckets, each parameter gathered and cast as its bucket is
  built): 2 bytes per parameter, equal to the gathered state cast to bf16, and the GPU's peak
  memory above the shards while streaming (ok within 3 buckets; a whole bf16 copy would be
  ``bf16_model_gb``).
- ``shard_load``: the model saved as safetensors, then built as each training rank builds it (meta
  device, its shard allocated on the GPU, only its rows read from the file, rotary buffers
  recomputed): the gathered weights equal the saved ones, and the GPU's peak while loading stays
  within the float32 shard plus one weight (``peak_above_before_gb``, the peak above what was
  allocated before the load, against ``shard_gb``).
"""

from __future__ import annotations

import argparse
import gc
import copy
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "systems"))  # benchmarks/systems/: reference_scoring.py

GB = 2**30


def _peak(device: str) -> float | None:
    """Peak allocated GB since the last call (None on the CPU)."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    peak = round(torch.cuda.max_memory_allocated() / GB, 3)
    torch.cuda.reset_peak_memory_stats()
    return peak


def _model(device: str, dry: bool) -> Any:
    from reference_scoring import small_model

    if dry:
        return small_model(4096, 128, 2, device).float().train()
    return small_model(0, 0, 0, device, preset="qwen3-0.6b").float().train()


def check_fsdp(device: str, dry: bool, mesh: Any) -> tuple[dict[str, Any], Any]:
    from tracerl.distributed.update import plan_update, sharded_policy_update
    from tracerl.distributed.fsdp import full_state_dict, shard_model
    from tracerl.train.update import UpdateSettings, policy_update

    plain = _model(device, dry)
    start = {k: v.detach().float().cpu().clone() for k, v in plain.state_dict().items()}
    n, length, micro = (4, 128, 2) if dry else (8, 1024, 4)
    from gpu_check_shapes import update_batch  # the update's work at a shape, shared with gpu_check

    trajs, advs = update_batch(plain.config.vocab_size, n, length)
    settings = UpdateSettings(micro_batch_size=micro, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                              loss_agg="token-mean", grad_clip=1e9, dtype="bfloat16")
    _peak(device)
    sharded = shard_model(copy.deepcopy(plain), mesh, "bfloat16")
    shard_peak = _peak(device)
    began = time.perf_counter()
    share = plan_update(trajs, advs, settings, False, 1)[0]
    metrics = sharded_policy_update(sharded, torch.optim.SGD(sharded.parameters(), lr=1.0), share, settings, 0)
    seconds = time.perf_counter() - began
    update_peak = _peak(device)
    fsdp_state = {k: v.float() for k, v in full_state_dict(sharded).items()}
    gather_peak = _peak(device)
    plain_metrics = policy_update(plain, torch.optim.SGD(plain.parameters(), lr=1.0), trajs, advs, settings, 0)
    plain_state = {k: v.detach().float().cpu().clone() for k, v in plain.state_dict().items()}
    del plain
    num = sum(float(((fsdp_state[k] - start[k]) - (plain_state[k] - start[k])).pow(2).sum()) for k in fsdp_state)
    den = sum(float((plain_state[k] - start[k]).pow(2).sum()) for k in fsdp_state)
    gap = (num / max(den, 1e-30)) ** 0.5
    return {"parameters": sum(v.numel() for v in start.values()), "trajectories": n, "tokens_per_trajectory": length,
            "update_seconds": round(seconds, 3), "loss_fsdp": metrics["loss"], "loss_plain": plain_metrics["loss"],
            "grad_norm_fsdp": metrics["grad_norm"], "grad_norm_plain": plain_metrics["grad_norm"],
            "relative_gap": gap, "peak_memory_gb": {"shard": shard_peak, "update": update_peak, "gather": gather_peak},
            "ok": bool(den > 0 and gap < 0.05 and metrics["nonfinite_skipped"] == 0.0)}, sharded


def _receiver(inbox: Any, outbox: Any) -> None:
    """The second process: copy every pushed tensor into its own memory, answer seconds and checksums."""
    for _ in range(2):
        state = inbox.get()
        began = time.perf_counter()
        mine = {k: v.clone() for k, v in state.items()}
        if any(v.is_cuda for v in mine.values()):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        del state
        outbox.put((seconds, {k: float(v.double().sum()) for k, v in mine.items()}))


def check_ipc(device: str, dry: bool) -> dict[str, Any]:
    """Push a model's weights (bf16 on CUDA) twice to a spawned process; the second push is timed."""
    model = _model(device, dry).to(torch.bfloat16 if device.startswith("cuda") else torch.float32)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    size = sum(v.numel() * v.element_size() for v in state.values())
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=_receiver, args=(inbox, outbox))
    worker.start()
    try:
        timings = []
        for _ in range(2):  # the first push also opens the CUDA context in the receiver
            began = time.perf_counter()
            inbox.put(state)
            copy_seconds, sums = outbox.get(timeout=300)
            timings.append((time.perf_counter() - began, copy_seconds))
    finally:
        worker.join(timeout=60)
    ours = {k: float(v.double().sum()) for k, v in state.items()}
    total, copy_only = timings[-1]
    return {"transport": "cuda_ipc" if device.startswith("cuda") else "cpu_shared_memory", "bytes": size,
            "seconds": round(total, 4), "gb_per_s": round(size / GB / total, 2),
            "copy_gb_per_s": round(size / GB / max(copy_only, 1e-9), 2), "equal_weights": sums == ours,
            "ok": bool(sums == ours and worker.exitcode == 0)}


def check_dcp(device: str, dry: bool, sharded: Any, mesh: Any, work: Path) -> dict[str, Any]:
    from tracerl.runs.sharded import load_sharded, save_sharded
    from tracerl.distributed.fsdp import full_state_dict, shard_model

    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-6)
    for p in sharded.parameters():  # one AdamW step so there are moments to save
        p.grad = torch.ones_like(p)
    optimizer.step()
    began = time.perf_counter()
    save_sharded(work / "dcp", sharded, optimizer)
    save_seconds = time.perf_counter() - began
    fresh = shard_model(_model(device, dry), mesh, "bfloat16")
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-6)
    began = time.perf_counter()
    load_sharded(work / "dcp", fresh, fresh_opt)
    load_seconds = time.perf_counter() - began
    a, b = full_state_dict(sharded), full_state_dict(fresh)
    weights = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    moments = all(torch.equal(optimizer.state[p]["exp_avg_sq"].full_tensor(), fresh_opt.state[q]["exp_avg_sq"].full_tensor())
                  for p, q in zip(sharded.parameters(), fresh.parameters(), strict=True))
    disk = sum(f.stat().st_size for f in (work / "dcp").rglob("*") if f.is_file())
    return {"save_seconds": round(save_seconds, 3), "load_seconds": round(load_seconds, 3),
            "disk_gb": round(disk / GB, 3), "equal_weights": bool(weights), "equal_optimizer": bool(moments),
            "ok": bool(weights and moments)}


def check_sync_buckets(device: str, sharded: Any) -> dict[str, Any]:
    """Stream the sharded policy's weights as bf16 buckets (what RayExecutor.sync_weights sends)."""
    from tracerl.distributed.fsdp import full_state_dict
    from tracerl.models.weights import DEFAULT_BUCKET_BYTES, weight_buckets

    full = {k: v.to(torch.bfloat16) for k, v in full_state_dict(sharded).items()}
    _peak(device)
    base = torch.cuda.memory_allocated() / GB if device.startswith("cuda") else None
    began, sent, count, equal = time.perf_counter(), 0, 0, True
    for bucket in weight_buckets(sharded, DEFAULT_BUCKET_BYTES, torch.bfloat16):
        for name, tensor in bucket:
            sent += tensor.numel() * tensor.element_size()
            equal = equal and tensor.dtype == torch.bfloat16 and torch.equal(tensor.cpu(), full[name].cpu())
        count += 1
        del bucket
    seconds = time.perf_counter() - began
    peak = _peak(device)
    above = None if peak is None or base is None else round(peak - base, 3)
    parameters = sum(p.numel() for p in sharded.parameters())  # a tied head once, as the buckets send it
    bounded = above is None or above <= 3 * DEFAULT_BUCKET_BYTES / GB
    return {"buckets": count, "bytes": sent, "bytes_per_parameter": sent / parameters, "seconds": round(seconds, 3),
            "peak_above_shards_gb": above, "bucket_gb": round(DEFAULT_BUCKET_BYTES / GB, 3),
            "bf16_model_gb": round(2 * parameters / GB, 3), "equal_to_gathered": equal,
            "ok": bool(equal and sent == 2 * parameters and bounded)}


def check_shard_load(device: str, dry: bool, mesh: Any, work: Path) -> dict[str, Any]:
    """Build the sharded policy from a safetensors folder on the meta device (what every rank does)."""
    from tracerl.distributed.fsdp import full_state_dict
    from tracerl.distributed.shard_load import local_bytes, sharded_from_folder

    source = _model("cpu", dry)
    source.save_pretrained(work / "model")
    saved = {k: v.clone() for k, v in source.state_dict().items()}
    largest = max(p.numel() * p.element_size() for p in source.parameters())
    del source
    # The bound is on what loading adds: earlier sections' sharded models sit in reference cycles
    # (FSDP2 state and hooks) until a collection, and they are not the load's doing.
    cuda = device.startswith("cuda")
    before_gc = torch.cuda.memory_allocated() / GB if cuda else None
    gc.collect()
    before = torch.cuda.memory_allocated() / GB if cuda else None
    _peak(device)
    began = time.perf_counter()
    sharded = sharded_from_folder(work / "model", mesh, "bfloat16", device)
    seconds = time.perf_counter() - began
    peak = _peak(device)
    shard = local_bytes(sharded)
    gathered = full_state_dict(sharded)
    equal = all(torch.equal(gathered[k].cpu(), saved[k]) for k in gathered) and len(gathered) >= len(
        list(sharded.parameters()))
    added = None if peak is None or before is None else round(peak - before, 3)
    bounded = added is None or added <= (shard + largest) / GB + 0.01
    return {"seconds": round(seconds, 3), "shard_gb": round(shard / GB, 3),
            "allocated_before_gc_gb": None if before_gc is None else round(before_gc, 3),
            "allocated_before_gb": None if before is None else round(before, 3), "peak_gb": peak,
            "peak_above_before_gb": added, "largest_weight_gb": round(largest / GB, 3),
            "equal_to_saved": bool(equal), "ok": bool(equal and bounded)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, a small model (checks the script).")
    parser.add_argument("--out", default="benchmarks/results/gpu_check_dist.json")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check_dist: no CUDA GPU found (torch.cuda.is_available() is False). Run it on a machine with "
              "a GPU, or `--dry-run` for a CPU run of the script.", file=sys.stderr)
        sys.exit(2)
    device = "cpu" if args.dry_run else "cuda"
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import torch.distributed as dist

    from tracerl.distributed.fsdp import init_distributed

    mesh = init_distributed("auto", device, timeout_s=300)
    report: dict[str, Any] = {"setup": {"device": device, "backend": dist.get_backend(), "torch": torch.__version__,
                                        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                        "dry_run": args.dry_run}}
    from tracerl.testbed.provenance import provenance

    report["setup"]["provenance"] = provenance(None)  # random Qwen3 weights
    work = Path(tempfile.mkdtemp(prefix="tracerl-gpu-check-dist-"))
    began = time.perf_counter()
    sections = ("fsdp", "ipc", "dcp", "sync_buckets", "shard_load")

    def write(complete: bool) -> None:  # after every section: a run stopped later keeps what it measured
        report["seconds"] = round(time.perf_counter() - began, 1)
        report["complete"] = complete
        report["ok"] = complete and all(report.get(s, {}).get("ok") for s in sections)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{args.out}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(args.out)

    def section(name: str, run: Any) -> Any:
        try:
            result = run()
        except Exception as exc:  # recorded; the sections that do not need this one still run
            traceback.print_exc()
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            result = None
        else:
            report[name] = result[0] if name == "fsdp" else result
        write(False)
        return result

    try:
        fsdp = section("fsdp", lambda: check_fsdp(device, args.dry_run, mesh))
        sharded = fsdp[1] if fsdp is not None else None
        section("ipc", lambda: check_ipc(device, args.dry_run))
        if sharded is None:
            for name in ("dcp", "sync_buckets"):
                report[name] = {"ok": False, "error": "not run: the fsdp section failed"}
        else:
            section("dcp", lambda: check_dcp(device, args.dry_run, sharded, mesh, work))
            section("sync_buckets", lambda: check_sync_buckets(device, sharded))
        sharded = fsdp = None  # free the sharded model before the load check
        section("shard_load", lambda: check_shard_load(device, args.dry_run, mesh, work))
        for name in sections:
            print(f"{name}: {report[name]['ok']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()
    write(True)
    print(json.dumps({k: report[k] for k in ("ok", "seconds")}))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
