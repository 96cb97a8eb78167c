"""One-command GPU check: every preset trains on the GPU, resume works there, and the scorer,
engine and update run at Qwen3-0.6B's shape with bounded memory. Nothing is downloaded.

    python benchmarks/gpu/gpu_check.py [--device cuda] [--out benchmarks/results/gpu_check.json]

About 5 minutes on one GPU. On a machine without CUDA it says so and exits 2;
``--device cpu --small`` runs the same checks on a small model on the CPU (a dry run of the
script itself, what the test suite does).

What it checks (the JSON has one section each, stable keys):

- ``presets``: every method preset for 3 steps of the ``--smoke`` setting with bf16 compute
  (fp32 master weights), the smoke-pretrained tiny model (pretrained in seconds, cached) and
  the ``answered`` verifier, which rewards any final answer: that model answers in some
  rollouts and not in others, so groups are mixed and advantages non-zero (a preset whose
  update never trained a token fails the check). Per preset: losses, trained tokens, whether the parameters moved, time
  and peak memory per phase.
- ``resume``: 2 steps, a resume to 3, against 3 straight steps (same metrics and weights within
  a tolerance: GPU kernels are not bitwise deterministic).
- ``scorer``/``engine``/``update``: a random model of Qwen3-0.6B's shape (``--small``: a small
  one) in bf16 compute: batched reference scoring against one plain batched forward
  (``batched_ratio``), generation throughput over many chains, one optimiser step's peak memory.
- ``packed_update``: the tree-packed update (``optim.tree_packing``) against every leaf apart on
  the same 4 trees x 4 leaves of 1,024 tokens: time, peak memory, tokens forwarded, gradient gap;
  on CUDA also the flex-attention packed update (``optim.packed_attention = 'flex'``).
  ``packed_update_4k``: the same at 4,096 tokens a leaf (not with ``--small``).
- ``engine`` times the seeded path rollouts use, warmed up at the measured shape, with two arms:
  the shared model under autocast (``model.generation_dtype = auto``) and the bf16 copy
  (``bfloat16``), each with a 10-step profile (wall, kernel time, launches, syncs per step).

The engine and packed-update arms alone (old vs new side by side, a few minutes):
``python benchmarks/gpu/gpu_check.py --skip presets --skip resume --skip scorer --skip update
--out benchmarks/results/gpu_engine_arms.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracerl.config.schema import PRESETS, resolve_config  # noqa: E402
from tracerl.train.loop import Trainer  # noqa: E402

GB = 2**30


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize(device)
    return round(torch.cuda.max_memory_allocated(device) / GB, 3)


def _smoke_config(preset: str, device: str, dtype: str, steps: int) -> Any:
    # The smoke-pretrained tiny model answers in some rollouts and not in others, so with the
    # `answered` (format) reward the groups are mixed and every preset's update runs.
    overrides = [f"model.device={device}", f"model.dtype={dtype}", "data.verifier=answered", f"steps={steps}",
                 "log.checkpoint_every=1", "model.name_or_path=tiny", "model.tiny_preset=smoke"]
    return resolve_config(preset, overrides=overrides, smoke="random")


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in trainer.model.state_dict().items()}


def _check_preset(preset: str, device: str, dtype: str, work: Path) -> dict[str, Any]:
    _peak_reset(device)
    start = time.perf_counter()
    trainer = Trainer(_smoke_config(preset, device, dtype, 3), work / preset)
    before = _params(trainer)
    records = trainer.run(3)
    after = _params(trainer)
    moved = any(not torch.equal(before[k], after[k]) for k in before)
    finite = all(torch.isfinite(v).all() for v in after.values())
    result = {
        "losses": [r.get("loss") for r in records],
        "trained_tokens": [r.get("trained_tokens") for r in records],
        "params_changed": bool(moved),
        "weights_finite": bool(finite),
        "phase_seconds": {k[5:]: round(sum(r.get(k, 0.0) for r in records), 3)
                          for k in records[-1] if k.startswith("time_")},
        "phase_peak_memory_gb": {k[12:]: max((r.get(k) or 0.0) for r in records)
                                 for k in records[-1] if k.startswith("peak_mem_gb_")},
        "seconds": round(time.perf_counter() - start, 2),
        "peak_memory_gb": _peak_gb(device),
        "ok": bool(moved and finite and any((t or 0) > 0 for t in (r.get("trained_tokens") for r in records))),
    }
    trainer.close() if hasattr(trainer, "close") else None
    del trainer
    return result


def check_presets(device: str, dtype: str, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for preset in PRESETS:
        try:
            out[preset] = _check_preset(preset, device, dtype, work)
        except Exception as exc:  # one preset's failure is recorded; the others still run
            traceback.print_exc()
            out[preset] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"preset {preset}: {out[preset]['ok']} ({out[preset].get('seconds')} s)", flush=True)
    return out


def check_resume(device: str, dtype: str, work: Path) -> dict[str, Any]:
    straight_dir, resumed_dir = work / "resume_straight", work / "resume_split"
    straight = Trainer(_smoke_config("trace", device, dtype, 3), straight_dir)
    straight_records = straight.run(3)
    first = Trainer(_smoke_config("trace", device, dtype, 3), resumed_dir)
    first.run(2)
    if hasattr(first, "close"):
        first.close()
    del first
    second = Trainer(_smoke_config("trace", device, dtype, 3), resumed_dir, resume=True)
    resumed_records = second.run(3)
    a, b = _params(straight), _params(second)
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    loss_a, loss_b = straight_records[-1].get("loss"), resumed_records[-1].get("loss")
    return {
        "resumed_step": second.step_index,
        "max_weight_diff": max_diff,
        "last_loss_straight": loss_a,
        "last_loss_resumed": loss_b,
        "ok": bool(second.step_index == 3 and max_diff < 1e-2),
    }


def _write(report: dict[str, Any], out: str, start: float, *, complete: bool) -> None:
    """Write the report so far; ``ok`` is false until every section asked for has run and passed."""
    report["seconds"] = round(time.perf_counter() - start, 1)
    checks = [report[s]["ok"] for s in ("resume",) if s in report]
    checks += [v["ok"] for v in report.get("presets", {}).values()]
    checks += [report[s]["ok"] for s in ("scorer", "engine", "update", "packed_update") if s in report]
    report["complete"] = complete
    report["ok"] = complete and all(checks)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{out}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--small", action="store_true", help="Small shapes instead of Qwen3-0.6B's (CPU dry run).")
    parser.add_argument("--skip", action="append", default=[], help="Skip a section (presets, resume, scorer, engine, update, packed_update, packed_update_4k).")
    parser.add_argument("--out", default="benchmarks/results/gpu_check.json")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU found (torch.cuda.is_available() is False). Run it on a machine with "
              "a GPU, or `--device cpu --small` for a dry run of the script.", file=sys.stderr)
        sys.exit(2)
    import transformers

    report: dict[str, Any] = {
        "setup": {
            "device": args.device,
            "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor(),
            "dtype": args.dtype, "small": args.small, "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
    }
    from tracerl.testbed.provenance import provenance

    report["setup"]["provenance"] = provenance("tiny", "smoke")  # the runs' model.tiny_preset
    work = Path(tempfile.mkdtemp(prefix="tracerl-gpu-check-"))
    start = time.perf_counter()
    try:
        from gpu_check_shapes import check_engine, check_packed_update, check_scorer, check_update

        sections = {
            "presets": lambda: check_presets(args.device, args.dtype, work),
            "resume": lambda: check_resume(args.device, args.dtype, work),
            "scorer": lambda: check_scorer(args.device, args.small),
            "engine": lambda: check_engine(args.device, args.small),
            "update": lambda: check_update(args.device, args.small),
            "packed_update": lambda: check_packed_update(args.device, args.small),
            "packed_update_4k": lambda: check_packed_update(args.device, args.small, length=4096),
        }
        if args.small:  # the dry run's packed update is already at its small shape
            sections.pop("packed_update_4k")
        for name, run in sections.items():
            if name in args.skip:
                continue
            _peak_reset(args.device)
            try:
                report[name] = run()
            except Exception as exc:  # a failed section is recorded and the others still run
                traceback.print_exc()
                report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {'done' if report[name].get('ok', True) else 'FAILED'}", flush=True)
            _write(report, args.out, start, complete=False)  # a run stopped later keeps what it measured
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _write(report, args.out, start, complete=True)
    print(json.dumps({k: report[k] for k in ("ok", "seconds")}))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
