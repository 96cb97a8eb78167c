"""Cost of reference scoring as a ratio to one forward pass over the whole trajectory.

For 2, 8 and 32 cut points at 512 and 2048 tokens on a small random Qwen3 model, times
``score_prefixes`` (packed: one prefill plus one packed forward; crop: cache extended cut by
cut) and ``score_prefixes_naive`` (one forward per cut), each divided by the time of one plain
forward over the full sequence. The floor is about ``1 + cuts * (opener + answer - 1) / L``
(tokens processed over tokens of one forward).

Batched case (``batched_*`` keys of each case): N trajectories of the same length and cut count
(N = 16 with --quick, else 64 at 512 tokens and 16 at 2048), in groups of four: even groups are
trees whose four leaves share a trunk up to the middle boundary, odd groups are independent
chains, one gold answer per group. ``batched_ratio`` is ``score_prefixes_batched`` over all of
them divided by one plain batched forward [N, L] (logits at every position, as ``forward``);
``batched_unpacked_ratio`` the same without trie rows (``max_row_tokens=1``: every leaf
prefilled in full, causal); ``looped_ratio`` is the per-trajectory scorer called N times over the
same forward; ``batched_prefill_tokens`` counts the distinct tokens the trie rows prefilled
(against N x L).

    python benchmarks/systems/reference_scoring.py [--quick] [--device cuda] [--out benchmarks/results/reference_scoring.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.models.batched_scoring import ScoreRequest, ScoreStats, score_prefixes_batched
from tracerl.models.scoring import score_prefixes, score_prefixes_naive
from tracerl.testbed.provenance import git_state

OPENER, ANSWER = 4, 3  # "Action : answer [" and a three-token entity, as in the react format


# Qwen3-0.6B's shape (random weights: nothing is downloaded), for a GPU run with --preset.
QWEN3_0_6B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072, vocab_size=151936)


def small_model(vocab: int, hidden: int, layers: int, device: str, preset: str = "small") -> Any:
    torch.manual_seed(0)
    shape = dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=4, head_dim=hidden // 8, intermediate_size=3 * hidden,
    )
    if preset == "qwen3-0.6b":
        shape = dict(QWEN3_0_6B)
    config = Qwen3Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    dtype = torch.bfloat16 if device.startswith("cuda") and preset != "small" else torch.float32
    return AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fns: dict[str, Callable[[], Any]], reps: int, device: str, warmup: bool = True) -> dict[str, float]:
    """Median wall time of each function over ``reps`` interleaved rounds after one warm-up.

    Interleaving makes load from other processes hit every variant alike, so ratios stay
    meaningful on a shared machine.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values() if warmup else ():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


@torch.no_grad()
def run_case(model: Any, length: int, cuts: int, reps: int, device: str) -> dict[str, float]:
    gen = torch.Generator().manual_seed(length * 100 + cuts)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (length,), generator=gen).to(device)
    # Boundaries spread over the trajectory; the last one is its end (S_T).
    points = sorted({int(length * (i + 1) / cuts) for i in range(cuts)})
    answer = torch.randint(0, vocab, (ANSWER,), generator=gen).to(device)
    opener = torch.randint(0, vocab, (OPENER,), generator=gen).to(device)
    # "forward": one plain forward with logits at every position; "last": the same forward
    # projecting only the last position onto the vocabulary (the scorers need few logits, so
    # this stricter baseline shows the cost of the extra tokens alone).
    t = timed(
        {
            "forward": lambda: model(input_ids=ids[None], use_cache=False),
            "last": lambda: model(input_ids=ids[None], use_cache=False, logits_to_keep=1),
            "packed": lambda: score_prefixes(model, ids, points, answer, opener_ids=opener, method="packed"),
            "crop": lambda: score_prefixes(model, ids, points, answer, opener_ids=opener, method="crop"),
        },
        reps,
        device,
    )
    # The naive oracle is slow: one round, bracketed by plain forwards to normalise it.
    naive = timed(
        {
            "before": lambda: model(input_ids=ids[None], use_cache=False),
            "naive": lambda: score_prefixes_naive(model, ids, points, answer, opener_ids=opener),
            "after": lambda: model(input_ids=ids[None], use_cache=False),
        },
        1,
        device,
        warmup=False,
    )
    full, body, packed, crop = t["forward"], t["last"], t["packed"], t["crop"]
    naive_ratio = naive["naive"] / (0.5 * (naive["before"] + naive["after"]))
    return {
        "cuts": len(points),
        "length": length,
        "cached_ratio": round(packed / full, 3),
        "crop_ratio": round(crop / full, 3),
        "naive_ratio": round(naive_ratio, 3),
        "cached_ratio_vs_last_logit_forward": round(packed / body, 3),
        "floor": round(1 + len(points) * (OPENER + ANSWER - 1) / length, 3),  # tokens processed / L
        "forward_s": round(full, 5),
        "last_logit_forward_s": round(body, 5),
    }


def forest(vocab: int, length: int, points: list[int], n: int, seed: int) -> list[ScoreRequest]:
    """``n`` trajectories in groups of four: trees (a trunk shared up to the middle boundary) and chains."""
    gen = torch.Generator().manual_seed(seed)

    def draw(k: int) -> list[int]:
        return torch.randint(0, vocab, (k,), generator=gen).tolist()

    requests = []
    for group in range(0, n, 4):
        answer, opener = tuple(draw(ANSWER)), tuple(draw(OPENER))
        trunk = draw(points[(len(points) - 1) // 2]) if (group // 4) % 2 == 0 else []
        for _ in range(min(4, n - group)):
            ids = trunk + draw(length - len(trunk))
            requests.append(ScoreRequest(tuple(ids), tuple(points), answer, opener))
    return requests


@torch.no_grad()
def run_batched(model: Any, length: int, points: list[int], n: int, reps: int, device: str) -> dict[str, float]:
    """Batched scorer vs one plain batched forward over the same trajectories' tokens."""
    requests = forest(model.config.vocab_size, length, points, n, seed=length + len(points))
    ids = torch.tensor([list(r.input_ids) for r in requests], device=device)
    stats = ScoreStats()
    score_prefixes_batched(model, requests, stats=stats)
    t = timed(
        {
            "forward": lambda: model(input_ids=ids, use_cache=False),
            "last": lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1),
            "batched": lambda: score_prefixes_batched(model, requests),
            "unpacked": lambda: score_prefixes_batched(model, requests, max_row_tokens=1),
        },
        reps,
        device,
    )
    tensors = [(ids[i], torch.tensor(r.answer_ids, device=device), torch.tensor(r.opener_ids, device=device))
               for i, r in enumerate(requests)]
    looped = timed(
        {"looped": lambda: [score_prefixes(model, x, points, a, opener_ids=o) for x, a, o in tensors]},
        1, device, warmup=False,
    )["looped"]
    return {
        "batched_ratio": round(t["batched"] / t["forward"], 3),
        "batched_ratio_vs_last_logit_forward": round(t["batched"] / t["last"], 3),
        "batched_unpacked_ratio": round(t["unpacked"] / t["forward"], 3),
        "looped_ratio": round(looped / t["forward"], 3),
        "batched_trajectories": n,
        "batched_cuts": stats.cuts,
        "batched_unique_cuts": stats.unique_cuts,
        "batched_forwards": stats.forwards,
        "batched_prefill_tokens": stats.prefill_tokens,
        "batched_forward_s": round(t["forward"], 5),
        "batched_s": round(t["batched"], 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Smaller model, 512 tokens only, fewer repeats.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave as is).")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--preset", default="small", choices=["small", "qwen3-0.6b"])
    parser.add_argument("--out", default="benchmarks/results/reference_scoring.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hidden, layers = (128, 2) if args.quick else (args.hidden, args.layers)
    lengths = [512] if args.quick else [512, 2048]
    reps = 3 if args.quick else 7
    model = small_model(args.vocab, hidden, layers, args.device, args.preset)
    params = sum(p.numel() for p in model.parameters())
    cases = []
    for length in lengths:
        for cuts in (2, 8, 32):
            case = run_case(model, length, cuts, reps, args.device)
            n = 16 if args.quick else (64 if length <= 512 else 16)
            points = sorted({int(length * (i + 1) / cuts) for i in range(cuts)})
            case.update(run_batched(model, length, points, n, reps, args.device))
            print(json.dumps(case))
            cases.append(case)
    from tracerl.testbed.provenance import provenance  # base model sha256 and machine facts for the JSON

    result = {
        "provenance": provenance(None),  # a random Qwen3 preset: no pretrained base model
        "cases": cases,
        "model": {"preset": args.preset, "hidden": model.config.hidden_size, "layers": model.config.num_hidden_layers,
                  "vocab": model.config.vocab_size, "parameters": params, "dtype": str(model.dtype),
                  "attn_implementation": model.config._attn_implementation},
        "opener_tokens": OPENER,
        "answer_tokens": ANSWER,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "quick": args.quick,
        "git": git_state(),  # the commit this was measured at (issue 48)
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
