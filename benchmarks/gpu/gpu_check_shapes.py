"""The model-shape sections of ``gpu_check.py``: scorer, generation and update at Qwen3-0.6B's shape
(random weights, nothing downloaded), or at a small shape for a CPU dry run (``small=True``)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "systems"))  # benchmarks/systems/: reference_scoring.py
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


def _generate_timed(policy: HFPolicy, prefixes: list[list[int]], params: SamplingParams, device: str,
                    dtype: str) -> tuple[list[Any], float]:
    """One seeded generate (the path rollouts take: one seed per row) under ``model.dtype``'s context,
    after a warm-up at the same shape (kernel selection and allocator growth stay out of the time)."""
    seeds = list(range(len(prefixes)))
    with compute_context(device, dtype):
        policy.generate(prefixes, params, seeds=seeds)
        policy.clear_prefix_cache()  # the timed call prefills again, as a new batch would
        _peak(device)
        _sync(device)
        start = time.perf_counter()
        gens = policy.generate(prefixes, params, seeds=seeds)
        _sync(device)
    return gens, time.perf_counter() - start


def _profile(policy: HFPolicy, prefixes: list[list[int]], device: str, dtype: str, steps: int = 10) -> dict[str, Any]:
    """``steps`` decode steps under torch.profiler: wall, device-kernel time, kernel launches and sync
    points per step (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize (the lagged
    engines' one wait a step, a step late), cudaMemcpyAsync and ``aten::_local_scalar_dense`` events): the figures that say whether a step is host-bound."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    params = SamplingParams(max_new_tokens=steps, temperature=1.0)
    with compute_context(device, dtype), profile(activities=activities) as prof:
        _sync(device)
        start = time.perf_counter()
        policy.generate(prefixes, params, seeds=list(range(len(prefixes))))
        _sync(device)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = [e for e in events if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)]
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                                                        "cudaMemcpyAsync", "aten::_local_scalar_dense"))
    return {"steps": steps, "wall_ms_per_step": round(1000 * wall / steps, 2),
            "device_kernel_ms_per_step": round(sum(e.self_device_time_total for e in kernels) / 1000 / steps, 2),
            "kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
            "syncs_per_step": round(syncs / steps, 1)}


def _logprob_gap(policy: HFPolicy, reference: Any, prefixes: list[list[int]], new: int, device: str, dtype: str,
                 rows: int = 8) -> dict[str, Any]:
    """Greedy generations of ``rows`` prefixes by ``policy``, teacher-forced through the trainer's model
    (``reference`` under the ``dtype`` context): max and mean |recorded - trainer| log-prob, and how
    often the trainer's argmax is the token the sampler chose."""
    prefixes = prefixes[:rows]
    with compute_context(device, dtype):
        gens = policy.generate(prefixes, SamplingParams(max_new_tokens=new, temperature=0.0))
    diffs, agree, total = [], 0, 0
    with torch.no_grad(), compute_context(device, dtype):
        for prefix, gen in zip(prefixes, gens, strict=True):
            seq = torch.tensor([prefix + gen.token_ids], device=device)
            logits = reference(input_ids=seq).logits[0, len(prefix) - 1 : -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            picked = logp.gather(-1, torch.tensor(gen.token_ids, device=device)[:, None]).squeeze(-1)
            diffs.append((picked.cpu() - torch.tensor(gen.logprobs)).abs())
            agree += int((logits.argmax(-1).cpu() == torch.tensor(gen.token_ids)).sum())
            total += len(gen.token_ids)
    flat = torch.cat(diffs)
    return {"rows": rows, "max_abs": round(float(flat.max()), 5), "mean_abs": round(float(flat.mean()), 6),
            "trainer_argmax_agreement": round(agree / max(total, 1), 4)}


def check_engine(device: str, small: bool) -> dict[str, Any]:
    """Generated tokens per second of the HF backend, seeded rows (the rollouts' path), two arms on
    one fp32 model: ``autocast`` (the shared model under ``model.dtype``: bf16 autocast on cuda, the
    default ``model.generation_dtype = auto``) and ``bf16_copy`` (``generation_dtype = bfloat16``:
    a bf16 copy, no autocast, bf16 KV), at 128 chains x 128 tokens (``bf16_copy`` also at 512
    chains), each warmed up at its measured shape; plus a 10-step profile of each arm and the
    bf16 arm's log-prob gap to the trainer's forward."""
    model = _model(device, small, torch.float32)
    vocab = model.config.vocab_size
    tokenizer = _NumberTokenizer(vocab)
    rows, new = (16, 16) if small else (128, 128)
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(3, vocab, (64,), generator=g).tolist() for _ in range(4 * rows)]
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    dtype = "float32" if small else "bfloat16"
    arms = {"autocast": HFPolicy(model, tokenizer), "bf16_copy": HFPolicy(model, tokenizer, generation_dtype=torch.bfloat16)}
    out: dict[str, Any] = {"chains": rows, "max_new_tokens": new, "prefix_tokens": 64, "sampling": "seeded rows"}
    for name, policy in arms.items():
        shapes = (rows, 4 * rows) if name == "bf16_copy" else (rows,)
        for n in shapes:
            gens, seconds = _generate_timed(policy, prefixes[:n], params, device, dtype)
            tokens = sum(len(x.token_ids) for x in gens)
            key = name if n == rows else f"{name}_{n}_chains"
            out[key] = {"chains": n, "generated_tokens": tokens, "seconds": round(seconds, 3),
                        "generated_tokens_per_s": round(tokens / seconds, 1), "peak_memory_gb": _peak(device)}
            if n == rows:
                out[key]["profile"] = _profile(policy, prefixes[:rows], device, dtype)
            if name == "bf16_copy" and n == rows:
                out[key]["greedy_logprob_gap_to_trainer"] = _logprob_gap(policy, model, prefixes, new, device, dtype)
    out["generated_tokens_per_s"] = out["autocast"]["generated_tokens_per_s"]
    out["bf16_copy_over_autocast"] = round(out["bf16_copy"]["generated_tokens_per_s"]
                                           / out["autocast"]["generated_tokens_per_s"], 3)
    out["ok"] = bool(out["autocast"]["generated_tokens"] > 0 and out["bf16_copy"]["generated_tokens"] > 0
                     and out["bf16_copy"]["greedy_logprob_gap_to_trainer"]["max_abs"] < 0.5)
    return out


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


def check_packed_update(device: str, small: bool, repeats: int = 3, length: int = 1024) -> dict[str, Any]:
    """The tree-packed update against every leaf apart, same model, same trees (4 trees x 4 leaves
    of ``length`` tokens, micro-batches of 8, bf16 compute): seconds, peak memory, tokens forwarded, and
    the gradients' relative gap (bf16 kernels differ in rounding, so the bound is loose). On CUDA a
    third mode, ``flex`` (``optim.packed_attention = 'flex'``: block-mask flex_attention, no quadratic
    row rule), runs beside the dense ``always``; torch has no FlexAttention backward on CPU.

    Both modes run on the one model (SGD at lr 0 leaves it as it was): first one warm-up update
    each (its time is kept as ``cold_seconds``: kernel selection and allocator growth), then
    ``repeats`` rounds alternating the two; ``seconds`` is the median of a mode's rounds, and
    ``update_never_over_always`` the median of the per-round ratios."""
    model = _model(device, small, torch.float32)
    vocab, (trees, length) = model.config.vocab_size, ((2, 128) if small else (4, length))
    if not small and length > 1024:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trajs, advs = tree_batch(vocab, trees, length)
    out: dict[str, Any] = {"trees": trees, "leaves": len(trajs), "tokens_per_leaf": length, "repeats": repeats}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    modes = ("never", "always", "flex") if device.startswith("cuda") else ("never", "always")
    settings = {mode: UpdateSettings(micro_batch_size=8, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                     loss_agg="token-mean", grad_clip=1e9, dtype="float32" if small else "bfloat16",
                                     tree_packing="always" if mode == "flex" else mode,
                                     packed_attention="flex" if mode == "flex" else "dense") for mode in modes}
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

    def gap(mode: str) -> float:
        pairs = zip(grads["never"], grads[mode], strict=True)
        return float(torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in pairs)) / total)

    out["gradient_relative_gap"] = gap("always")
    ratios = [n / max(a, 1e-9) for n, a in zip(times["never"], times["always"], strict=True)]
    out["update_never_over_always"] = round(statistics.median(ratios), 3)
    bound = 1e-4 if small else 5e-2
    out["ok"] = bool(len(grads["never"]) > 0 and out["gradient_relative_gap"] < bound
                     and out["always"]["update_forward_tokens"] < out["never"]["update_forward_tokens"])
    if "flex" in modes:
        out["flex_gradient_relative_gap"] = gap("flex")
        out["update_never_over_flex"] = round(statistics.median(
            [n / max(f, 1e-9) for n, f in zip(times["never"], times["flex"], strict=True)]), 3)
        out["update_always_over_flex"] = round(statistics.median(
            [a / max(f, 1e-9) for a, f in zip(times["always"], times["flex"], strict=True)]), 3)
        out["ok"] = bool(out["ok"] and out["flex_gradient_relative_gap"] < bound)
    else:
        out["flex"] = {"skipped": "torch has no FlexAttention backward on CPU"}
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
