"""The native GPU engine at Qwen3-0.6B's shape (issue 49): where a decode step's time goes, and what
the bf16 copy, the static/graph engine and the flex packed update buy. Random weights built from a
config; nothing is downloaded. The JSON is rewritten after every section (a run cut short keeps
what it measured); ``complete`` says whether it got to the end.

Sections (rows x 128 new tokens from 64-token prefixes, seeded rows: the rollouts' path):

- ``eager_profile``: today's engine (fp32 model, bf16 autocast, ``decode_engine = eager``), 10 steps
  under torch.profiler: wall, device-kernel time, kernel launches and sync points a step;
- ``bf16_eager``: the bf16 copy without autocast (``generation_dtype = bfloat16``) at 128 and 512 rows;
- ``hf_generate``: ``model.generate`` on the same bf16 copy at 128 rows (sampling, no stops);
- ``static``: the static/graph engine (``decode_engine = static``: StaticCache slots, CUDA graphs
  through ``torch.compile(mode="reduce-overhead")``) at 128 and 512 rows, first call (capture) timed
  apart, plus its own 10-step profile; ``async`` at 128 rows;
- ``exactness``: greedy tokens of the static engine against the bf16 eager engine (exact-match rate)
  and a teacher-forced check of its log-probs through the trainer's model (max |diff| < 0.05,
  argmax agreement >= 99%);
- ``packed_update``: the tree-packed update dense vs flex vs the leaves apart at 1k and 4k tokens a
  leaf (:func:`gpu_check_shapes.check_packed_update`);
- ``hf_generate_static_compile``: ``generate(cache_implementation="static")`` (transformers' own
  compiled decode), when time remains.

    python benchmarks/gpu/gpu_engine_check.py                    # one H100/H200, <= 8 minutes
    python benchmarks/gpu/gpu_engine_check.py --device cpu --small  # dry run, seconds

Sections that need CUDA are recorded as skipped, with the reason, on the CPU. Exits 2 when
``--device cuda`` finds no GPU, 1 when a section failed or missed its bound.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_json  # noqa: E402
from gpu_check_shapes import (  # noqa: E402
    _logprob_gap, _model, _NumberTokenizer, _peak, _profile, _sync, check_packed_update)

from tracerl.models.backend import HFPolicy, SamplingParams  # noqa: E402
from tracerl.models.precision import compute_context  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _shape(small: bool) -> dict[str, int]:
    return dict(rows=8, big=16, new=8, prefix=16) if small else dict(rows=128, big=512, new=128, prefix=64)


def _prefixes(vocab: int, n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _timed(policy: HFPolicy, prefixes: list[list[int]], new: int, device: str, dtype: str) -> dict[str, Any]:
    """Seeded generate of ``prefixes`` x ``new`` tokens: the first call (warm-up: kernel selection,
    graph capture) and the second, timed, after clearing the prefix store (it prefills again)."""
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    seeds = list(range(len(prefixes)))
    out: dict[str, Any] = {"rows": len(prefixes), "max_new_tokens": new}
    with compute_context(device, dtype):
        for name in ("first_call", "timed"):
            policy.clear_prefix_cache()
            _sync(device)
            start = time.perf_counter()
            gens = policy.generate(prefixes, params, seeds=seeds)
            _sync(device)
            out[f"{name}_seconds"] = round(time.perf_counter() - start, 3)
    tokens = sum(len(g.token_ids) for g in gens)
    out.update(generated_tokens=tokens, generated_tokens_per_s=round(tokens / out["timed_seconds"], 1),
               peak_memory_gb=_peak(device))
    return out


def section_eager_profile(ctx: dict[str, Any]) -> dict[str, Any]:
    policy = HFPolicy(ctx["model"], ctx["tokenizer"], decode_engine="eager")
    prefixes = ctx["prefixes"][: ctx["shape"]["rows"]]
    out = _timed(policy, prefixes, ctx["shape"]["new"], ctx["device"], ctx["dtype"])
    out["profile"] = _profile(policy, prefixes, ctx["device"], ctx["dtype"])
    return out


def section_bf16_eager(ctx: dict[str, Any]) -> dict[str, Any]:
    policy = ctx["bf16"]("eager")
    return {str(n): _timed(policy, ctx["prefixes"][:n], ctx["shape"]["new"], ctx["device"], ctx["dtype"])
            for n in (ctx["shape"]["rows"], ctx["shape"]["big"])}


def section_static(ctx: dict[str, Any]) -> dict[str, Any]:
    policy = ctx["bf16"]("static")
    out: dict[str, Any] = {"compiled": ctx["device"].startswith("cuda")}
    for n in (ctx["shape"]["rows"], ctx["shape"]["big"]):
        out[str(n)] = _timed(policy, ctx["prefixes"][:n], ctx["shape"]["new"], ctx["device"], ctx["dtype"])
    rows = ctx["prefixes"][: ctx["shape"]["rows"]]
    with compute_context(ctx["device"], ctx["dtype"]):  # the profile's own shape captured first, not profiled
        policy.generate(rows, SamplingParams(max_new_tokens=10, temperature=1.0), seeds=list(range(len(rows))))
    out["profile"] = _profile(policy, rows, ctx["device"], ctx["dtype"])
    out["async_" + str(ctx["shape"]["rows"])] = _timed(ctx["bf16"]("async"), ctx["prefixes"][: ctx["shape"]["rows"]],
                                                       ctx["shape"]["new"], ctx["device"], ctx["dtype"])
    return out


def _hf_generate(model: Any, prefixes: list[list[int]], new: int, device: str, **kwargs: Any) -> dict[str, Any]:
    ids = torch.tensor(prefixes, device=device)
    args = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                do_sample=True, top_k=0, top_p=1.0, pad_token_id=0, **kwargs)
    out: dict[str, Any] = {"rows": len(prefixes), "max_new_tokens": new}
    with torch.no_grad():
        for name in ("first_call", "timed"):
            _sync(device)
            start = time.perf_counter()
            model.generate(**args)
            _sync(device)
            out[f"{name}_seconds"] = round(time.perf_counter() - start, 3)
    out["generated_tokens_per_s"] = round(len(prefixes) * new / out["timed_seconds"], 1)
    return out


def section_hf_generate(ctx: dict[str, Any]) -> dict[str, Any]:
    return _hf_generate(ctx["bf16"]("eager").net, ctx["prefixes"][: ctx["shape"]["rows"]], ctx["shape"]["new"],
                        ctx["device"])


def section_hf_generate_static_compile(ctx: dict[str, Any]) -> dict[str, Any]:
    if not ctx["device"].startswith("cuda"):
        return {"skipped": "transformers compiles generate's static-cache decode on CUDA only"}
    return _hf_generate(ctx["bf16"]("eager").net, ctx["prefixes"][: ctx["shape"]["rows"]], ctx["shape"]["new"],
                        ctx["device"], cache_implementation="static")


def section_exactness(ctx: dict[str, Any]) -> dict[str, Any]:
    """Greedy: the static engine's tokens against the bf16 eager engine's (same bf16 weights), and
    its recorded log-probs against the trainer's fp32 model under ``model.dtype``'s autocast."""
    prefixes, new = ctx["prefixes"][: ctx["shape"]["rows"]], ctx["shape"]["new"]
    params = SamplingParams(max_new_tokens=new, temperature=0.0)
    with compute_context(ctx["device"], ctx["dtype"]):
        fast = ctx["bf16"]("static").generate(prefixes, params)
        ref = ctx["bf16"]("eager").generate(prefixes, params)
    same_rows = sum(a.token_ids == b.token_ids for a, b in zip(fast, ref, strict=True))
    agree = sum(x == y for a, b in zip(fast, ref, strict=True) for x, y in zip(a.token_ids, b.token_ids, strict=False))
    total = sum(len(b.token_ids) for b in ref)
    gap = _logprob_gap(ctx["bf16"]("static"), ctx["model"], prefixes, new, ctx["device"], ctx["dtype"])
    out = {"greedy_rows_identical": same_rows, "rows": len(ref), "greedy_token_agreement": round(agree / total, 4),
           "teacher_forced": gap}
    out["ok"] = bool(gap["max_abs"] < 0.05 and gap["trainer_argmax_agreement"] >= 0.99)
    return out


def section_packed_update(ctx: dict[str, Any]) -> dict[str, Any]:
    """Keyed by tokens a leaf (``--small``: one length, 128, and the 4k run skipped)."""
    out: dict[str, Any] = {}
    for n in (1024,) if ctx["small"] else (1024, 4096):
        result = check_packed_update(ctx["device"], ctx["small"], length=n)
        out[str(result["tokens_per_leaf"])] = result
    if ctx["small"]:
        out["4096"] = {"skipped": "--small: one short leaf length only"}
    return out


SECTIONS = [("eager_profile", section_eager_profile), ("bf16_eager", section_bf16_eager),
            ("hf_generate", section_hf_generate), ("static", section_static), ("exactness", section_exactness),
            ("packed_update", section_packed_update), ("hf_generate_static_compile", section_hf_generate_static_compile)]
OPTIONAL = {"hf_generate_static_compile"}
"""Sections run only when the time budget still has room (the issue: 'if time remains')."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="Tiny shapes: a dry run in seconds.")
    parser.add_argument("--budget-s", type=float, default=420.0, help="Optional sections start only before this.")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_engine_check.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU found: run with --device cpu --small for a dry run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    model = _model(args.device, args.small, torch.float32)  # the trainer's fp32 master weights
    tokenizer = _NumberTokenizer(model.config.vocab_size)
    shape = _shape(args.small)
    ctx: dict[str, Any] = {"device": args.device, "small": args.small, "model": model, "tokenizer": tokenizer,
                           "shape": shape, "dtype": "float32" if args.small else "bfloat16",
                           "prefixes": _prefixes(model.config.vocab_size, shape["big"], shape["prefix"])}
    copies: dict[str, HFPolicy] = {}

    def bf16(engine: str) -> HFPolicy:  # one bf16 copy per engine, built once
        if engine not in copies:
            copies[engine] = HFPolicy(model, tokenizer, generation_dtype=torch.bfloat16, decode_engine=engine)
        return copies[engine]

    ctx["bf16"] = bf16
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                              "torch": torch.__version__, "small": args.small, "shape": shape, "complete": False}
    ok = True
    for name, fn in SECTIONS:
        if name in OPTIONAL and time.perf_counter() - start > args.budget_s:
            report[name] = {"skipped": f"time budget of {args.budget_s:.0f} s spent"}
            continue
        t0 = time.perf_counter()
        try:
            report[name] = fn(ctx)
        except Exception as exc:  # one section's failure must not lose the others' numbers
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        report[name]["section_seconds"] = round(time.perf_counter() - t0, 2)
        ok = ok and "error" not in report[name] and report[name].get("ok", True) is not False
        write_json(args.out, report)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    report.update(complete=True, ok=ok, total_seconds=round(time.perf_counter() - start, 1))
    write_json(args.out, report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
