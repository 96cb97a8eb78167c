"""The model-shape sections of ``gpu_check.py``: scorer, generation and update at Qwen3-0.6B's shape
(random weights, nothing downloaded), or at a small shape for a CPU dry run (``small=True``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from reference_scoring import QWEN3_0_6B, run_batched, small_model

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.precision import compute_context
from tracerl.train.update import UpdateSettings, policy_update

GB = 2**30
SMALL = dict(vocab=4096, hidden=128, layers=2)


def update_batch(vocab: int, n: int, length: int) -> tuple[list[Trajectory], list[torch.Tensor]]:
    """``n`` one-turn trajectories of ``length`` random tokens (a quarter prompt), advantages +-1:
    the update's work at a given shape, with no rollout."""
    g = torch.Generator().manual_seed(0)
    trajs, advs = [], []
    for i in range(n):
        prompt = torch.randint(3, vocab, (length // 4,), generator=g).tolist()
        answer = torch.randint(3, vocab, (length - len(prompt),), generator=g).tolist()
        turn = Turn(assistant_ids=answer, observation_ids=[], text="", action=Action(kind="answer", answer="x"),
                    logprobs=[-5.0] * len(answer))
        trajs.append(Trajectory(task_id=f"t{i}", group_id="g", prompt_ids=prompt, turns=[turn]))
        advs.append(torch.full((length,), 1.0 if i % 2 else -1.0))
    return trajs, advs


def _model(device: str, small: bool, dtype: torch.dtype | None = None) -> Any:
    if small:
        model = small_model(SMALL["vocab"], SMALL["hidden"], SMALL["layers"], device)
    else:
        model = small_model(QWEN3_0_6B["vocab_size"], 0, 0, device, preset="qwen3-0.6b")
    return model if dtype is None else model.to(dtype=dtype)


def _peak(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize(device)
    peak = round(torch.cuda.max_memory_allocated(device) / GB, 3)
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def check_scorer(device: str, small: bool) -> dict[str, Any]:
    """Batched reference scoring of 64 trajectories x 512 tokens x 8 cuts (trees and chains) against
    one plain batched forward over the same tokens; the goal is ``batched_ratio <= 1.25``."""
    model = _model(device, small)  # bf16 weights on cuda: a frozen reference needs no master copy
    _peak(device)
    result = run_batched(model, 512, [64 * (i + 1) for i in range(8)], 16 if small else 64, 3, device)
    result["peak_memory_gb"] = _peak(device)
    result["ok"] = bool(result["batched_ratio"] > 0)
    del model
    return result


def check_engine(device: str, small: bool) -> dict[str, Any]:
    """Generated tokens per second of the HF backend over many chains (bf16 compute on cuda)."""
    model = _model(device, small, torch.float32)
    vocab = model.config.vocab_size
    tokenizer = _NumberTokenizer(vocab)
    policy = HFPolicy(model, tokenizer)
    rows, new = (16, 16) if small else (128, 128)
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(3, vocab, (64,), generator=g).tolist() for _ in range(rows)]
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    dtype = "float32" if small else "bfloat16"
    with compute_context(device, dtype):
        policy.generate(prefixes[:2], SamplingParams(max_new_tokens=4), generator=g)  # warm-up
        _peak(device)
        _sync(device)
        start = time.perf_counter()
        gens = policy.generate(prefixes, params, generator=g)
        _sync(device)
    seconds = time.perf_counter() - start
    tokens = sum(len(x.token_ids) for x in gens)
    return {"chains": rows, "max_new_tokens": new, "generated_tokens": tokens, "seconds": round(seconds, 3),
            "generated_tokens_per_s": round(tokens / seconds, 1), "peak_memory_gb": _peak(device),
            "ok": tokens > 0}


def check_update(device: str, small: bool) -> dict[str, Any]:
    """One optimiser step (fp32 master weights, bf16 compute, gradient checkpointing, chunked
    log-probs) over 16 trajectories of 1,024 tokens in micro-batches of 8; parameters must move."""
    model = _model(device, small, torch.float32)
    if not small:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab, (n, length) = model.config.vocab_size, ((4, 128) if small else (16, 1024))
    trajs, advs = update_batch(vocab, n, length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    settings = UpdateSettings(micro_batch_size=8 if not small else 2, temperature=1.0, clip_low=0.2, clip_high=0.28,
                              kl_coef=0.0, loss_agg="token-mean", grad_clip=1.0,
                              dtype="float32" if small else "bfloat16")
    before = {k: v.detach().clone() for k, v in list(model.named_parameters())[:4]}
    _peak(device)
    _sync(device)
    start = time.perf_counter()
    metrics = policy_update(model, optimizer, trajs, advs, settings, pad_id=0)
    _sync(device)
    seconds = time.perf_counter() - start
    moved = any(not torch.equal(before[k], p) for k, p in list(model.named_parameters())[:4])
    return {"trajectories": n, "tokens_per_trajectory": length, "seconds": round(seconds, 3),
            "loss": metrics["loss"], "params_changed": bool(moved), "peak_memory_gb": _peak(device),
            "ok": bool(moved and metrics.get("nonfinite_skipped", 0.0) == 0.0)}


def tree_batch(vocab: int, trees: int, length: int) -> tuple[list[Trajectory], list[torch.Tensor]]:
    """``trees`` trees of four two-turn leaves of ``length`` tokens: a prompt and first turn of a
    quarter each shared by the tree, two second turns (a quarter), each under two last answers."""
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    quarter = length // 4

    def turn(n: int, observed: int) -> Turn:
        return Turn(assistant_ids=ids(n), observation_ids=ids(observed), text="",
                    action=Action(kind="tool", name="search"), logprobs=[-5.0] * n)

    trajs, advs = [], []
    for t in range(trees):
        prompt, first = ids(quarter), turn(quarter // 2, quarter // 2)
        for second in (turn(quarter // 2, quarter // 2), turn(quarter // 2, quarter // 2)):
            for k in range(2):
                leaf = Trajectory(task_id=f"t{t}", group_id=f"t{t}", prompt_ids=prompt,
                                  turns=[first, second, turn(length - 3 * quarter, 0)])
                trajs.append(leaf)
                advs.append(torch.tensor(leaf.sampled, dtype=torch.float32) * (1.0 if k else -1.0))
    return trajs, advs


def check_packed_update(device: str, small: bool, repeats: int = 3) -> dict[str, Any]:
    """The tree-packed update against every leaf apart, same model, same trees (4 trees x 4 leaves
    of 1,024 tokens, micro-batches of 8, bf16 compute): seconds, peak memory, tokens forwarded, and
    the gradients' relative gap (bf16 kernels differ in rounding, so the bound is loose).

    Both modes run on the one model (SGD at lr 0 leaves it as it was): first one warm-up update
    each (its time is kept as ``cold_seconds``: kernel selection and allocator growth), then
    ``repeats`` rounds alternating the two; ``seconds`` is the median of a mode's rounds, and
    ``update_never_over_always`` the median of the per-round ratios."""
    model = _model(device, small, torch.float32)
    vocab, (trees, length) = model.config.vocab_size, ((2, 128) if small else (4, 1024))
    trajs, advs = tree_batch(vocab, trees, length)
    out: dict[str, Any] = {"trees": trees, "leaves": len(trajs), "tokens_per_leaf": length, "repeats": repeats}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    modes = ("never", "always")
    settings = {mode: UpdateSettings(micro_batch_size=8, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                     loss_agg="token-mean", grad_clip=1e9, dtype="float32" if small else "bfloat16",
                                     tree_packing=mode) for mode in modes}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    grads: dict[str, list[torch.Tensor]] = {}

    def once(mode: str) -> tuple[float, dict[str, Any]]:
        _sync(device)
        start = time.perf_counter()
        metrics = policy_update(model, optimizer, trajs, advs, settings[mode], pad_id=0)
        _sync(device)
        return time.perf_counter() - start, metrics

    for mode in modes:
        _peak(device)
        cold, metrics = once(mode)
        out[mode] = {"cold_seconds": round(cold, 3), "peak_memory_gb": _peak(device),
                     "update_forward_tokens": metrics["update_forward_tokens"],
                     "unique_trained_tokens": metrics["unique_trained_tokens"], "loss": metrics["loss"]}
        grads[mode] = [p.grad.detach().float().cpu() for p in model.parameters() if p.grad is not None]
    for _ in range(repeats):
        for mode in modes:
            times[mode].append(once(mode)[0])
    for mode in modes:
        out[mode]["seconds"] = round(statistics.median(times[mode]), 3)
        out[mode]["round_seconds"] = [round(t, 3) for t in times[mode]]
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads["never"]))
    gap = torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in zip(grads["never"], grads["always"], strict=True)))
    out["gradient_relative_gap"] = float(gap / total)
    ratios = [n / max(a, 1e-9) for n, a in zip(times["never"], times["always"], strict=True)]
    out["update_never_over_always"] = round(statistics.median(ratios), 3)
    out["ok"] = bool(len(grads["never"]) > 0 and out["gradient_relative_gap"] < (1e-4 if small else 5e-2)
                     and out["always"]["update_forward_tokens"] < out["never"]["update_forward_tokens"])
    return out


class _NumberTokenizer:
    """Just enough of a tokenizer for :class:`HFPolicy` on random ids (no stop strings used)."""

    eos_token_id = 2
    pad_token_id = 0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)
