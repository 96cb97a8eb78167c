"""Rollout engine throughput, and tokens saved by branching vs independent chains at equal leaves.

Runs the real engine (SynthWiki world, bm25 search tool, react format) with a small Qwen3
policy: a pretrained folder given with ``--model`` (e.g. the embedded tiny model), otherwise a
randomly initialised model over a word-level vocabulary of the world. Two schemes reach the
same number of leaves per task:

- ``chains``: ``leaves`` independent chains per task;
- ``branching``: ``roots`` chains per task, then the remaining leaves as continuations from the
  deepest open boundaries of those chains (``RolloutEngine.expand``), which resume from the
  stored prefix instead of regenerating it.

    python benchmarks/systems/rollout_throughput.py [--quick] [--model DIR]

``--decode-engine`` picks the HF backend's decode loop (``model.decode_engine``: ``auto`` = ``eager``
on a CPU, ``async``, ``static``); the JSON's ``setup.decode_engine`` records it.

``--backend hf,vllm`` runs both policy backends side by side in one process on the same model,
tasks and batches (HF first: vLLM's in-process CPU worker rebinds threads), and writes
``benchmarks/results/rollout_throughput_backends.json`` unless ``--out`` says otherwise. vLLM
needs its own environment (``make vllm``; run with ``.venv-vllm/bin/python``).

vLLM scheduling (``rollout.engine.vllm_scheduling``): the vLLM numbers are with ``independent``
requests (the default); ``vllm.scheduling`` in the JSON compares ``independent`` with
``lockstep`` on the same engine, equal leaves, chains and branching, on two workloads: the
random model as is (every turn runs to ``--turn-tokens``) and ``ragged_turns`` (the same model
with EOS made likely in some contexts, ``--ragged-eos-logit``, so turns end at different
lengths, as real agents' do). Both schedules sample the same trajectories (checked).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

from tracerl.agent.formats import get_format
from tracerl.core.types import RolloutTree
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.models.factory import decode_engine
from tracerl.core.protocol import RolloutCost
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.testbed.provenance import git_state


def random_policy(texts: list[str], hidden: int, layers: int, preset: str = "small") -> HFPolicy:
    """A word-level tokenizer over ``texts`` and a random Qwen3 model on it."""
    splitter = pre_tokenizers.Whitespace()
    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    for text in texts:
        for word, _ in splitter.pre_tokenize_str(text):
            vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = splitter
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(0)
    shape = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=hidden // 4, intermediate_size=3 * hidden)
    if preset == "qwen3-0.6b":  # Qwen3-0.6B's body with random weights; vocabulary from the world
        shape = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, intermediate_size=3072)
    config = Qwen3Config(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=2, pad_token_id=0, **shape)
    return HFPolicy(AutoModelForCausalLM.from_config(config).eval(), tokenizer)


def ragged_model(model: Any, eos: int, strength: float) -> Any:
    """A copy of ``model`` whose EOS logit is ``strength`` x the final hidden state's component 0
    (~N(0, 1) by context): embedding column 0 is zeroed for every token but EOS. Turns then end
    at EOS after a context-dependent number of tokens instead of all at the token limit."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, 0] = 0.0
        emb[eos, 0] = strength
    return model


def trees_digest(trees: list[RolloutTree]) -> str:
    """A short hash of the trees' structure and tokens (equal digests: the same trajectories)."""
    parts = [(t.tree_id, n.parent, n.turn.assistant_ids, n.turn.observation_ids)
             for t in trees for n in t.nodes if n.turn is not None]
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


def branch_requests(engine: RolloutEngine, trees: list[RolloutTree], extra: int) -> list[tuple[RolloutTree, int, int]]:
    """Spread ``extra`` continuations per tree over its deepest open boundaries (root if none)."""
    requests = []
    for tree in trees:
        open_nodes = [n for n in tree.nodes if n.parent is not None and engine.can_expand(tree, n.id)]
        open_nodes.sort(key=lambda n: -n.depth)
        anchors = [n.id for n in open_nodes[: max(1, extra // 2)]] or [0]
        for i in range(extra):
            requests.append((tree, anchors[i % len(anchors)], 1))
    return requests


def measure(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Fewer tasks and shorter turns.")
    parser.add_argument("--model", default=None, help="Pretrained model folder (default: random model).")
    parser.add_argument("--backend", default="hf", help="hf, vllm or both side by side: hf,vllm.")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM without torch.compile (faster start).")
    parser.add_argument("--vllm-block-size", type=int, default=32,
                        help="vLLM KV block size (only full blocks are prefix-cached; CPU default 128).")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--leaves", type=int, default=8, help="Leaves per task for both schemes.")
    parser.add_argument("--roots", type=int, default=2, help="Chains per task before branching.")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave as is).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="small", choices=["small", "qwen3-0.6b"])
    parser.add_argument("--decode-engine", default="auto", choices=["auto", "eager", "async", "static"],
                        help="The HF backend's decode loop (model.decode_engine).")
    parser.add_argument("--no-prefix-cache", action="store_true", help="Disable the cross-call KV store.")
    parser.add_argument("--ragged-eos-logit", type=float, default=6.0,
                        help="EOS strength of the ragged-turns workload of the vLLM scheduling comparison (0: skip it).")
    parser.add_argument("--out", default=None, help="JSON path (default depends on --backend).")
    args = parser.parse_args()
    args.backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not args.backends or any(b not in ("hf", "vllm") for b in args.backends):
        parser.error(f"--backend takes hf, vllm or hf,vllm; got {args.backend!r}")
    if args.out is None:
        name = "rollout_throughput.json" if args.backends == ["hf"] else "rollout_throughput_backends.json"
        args.out = f"benchmarks/results/{name}"
    if args.quick:
        args.tasks, args.turn_tokens = 4, 16
    return args


def run_schemes(policy: Any, env: ToolEnvironment, tasks: list, args: argparse.Namespace,
                scheduling: str = "independent") -> dict:
    """Chains vs branching at equal leaves through one backend: the summary of each and the saving.

    ``scheduling`` is ``rollout.engine.vllm_scheduling`` (the HF backend always runs lockstep)."""
    fmt = get_format("react")
    config = EngineConfig(max_turns=args.max_turns, max_turn_tokens=args.turn_tokens, max_total_tokens=1024,
                          vllm_scheduling=scheduling)
    gen = torch.Generator(device=args.device if isinstance(policy, HFPolicy) else "cpu").manual_seed(0)
    engine = RolloutEngine(policy, env, fmt, exact_match, config)
    engine.rollout(tasks[:2], [2, 2], generator=gen)  # warm-up
    stats0 = dict(policy.stats)
    (chains, chain_cost), chain_s = measure(lambda: engine.rollout(tasks, [args.leaves] * len(tasks), generator=gen))
    stats1 = dict(policy.stats)
    (roots, root_cost), root_s = measure(lambda: engine.rollout(tasks, [args.roots] * len(tasks), generator=gen))
    requests = branch_requests(engine, roots, args.leaves - args.roots)
    branch_cost, branch_s = measure(lambda: engine.expand(requests, generator=gen))
    stats2 = dict(policy.stats)
    tree_cost: RolloutCost = root_cost + branch_cost

    def summary(cost: RolloutCost, seconds: float, trees: list[RolloutTree], before: dict, after: dict) -> dict:
        leaves = sum(len(t.leaves()) for t in trees)
        out = {
            "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
            "reused_prefix_tokens": after["reused_prefix_tokens"] - before["reused_prefix_tokens"],
            "leaves": leaves,
            "rollouts": cost.rollouts,
            "generated_tokens": cost.generated_tokens,
            "seconds": round(seconds, 3),
            "generated_tokens_per_s": round(cost.generated_tokens / seconds, 1),
            "generated_tokens_per_leaf": round(cost.generated_tokens / leaves, 2),
            "seconds_per_leaf": round(seconds / leaves, 4),
            "mean_turns": round(sum(len(tr.turns) for t in trees for tr in t.trajectories.values()) / leaves, 2),
            "trees_digest": trees_digest(trees),
        }
        if "engine_steps" in after:  # vLLM
            out["engine_steps"] = after["engine_steps"] - before["engine_steps"]
        return out

    chain_summary = summary(chain_cost, chain_s, chains, stats0, stats1)
    tree_summary = summary(tree_cost, root_s + branch_s, roots, stats1, stats2)
    saved = 1 - tree_summary["generated_tokens_per_leaf"] / chain_summary["generated_tokens_per_leaf"]
    return {
        "chains": chain_summary,
        "branching": tree_summary,
        "tokens_saved_per_leaf": round(chain_summary["generated_tokens_per_leaf"] - tree_summary["generated_tokens_per_leaf"], 2),
        "tokens_saved_fraction": round(saved, 3),
        "branching_vs_chains_seconds_per_leaf": round(tree_summary["seconds_per_leaf"] / chain_summary["seconds_per_leaf"], 3),
    }


def compare_scheduling(independent: list[dict], lockstep: list[dict]) -> dict:
    """Independent vs lockstep vLLM requests on one workload (equal leaves, same trajectories):
    per scheme, each schedule's fastest run (all runs' seconds listed)."""
    keys = ("seconds", "generated_tokens", "generated_tokens_per_s", "engine_steps", "seconds_per_leaf", "mean_turns")
    out: dict[str, Any] = {}
    for scheme in ("chains", "branching"):
        ind = min((r[scheme] for r in independent), key=lambda x: x["seconds"])
        lock = min((r[scheme] for r in lockstep), key=lambda x: x["seconds"])
        digests = {r[scheme]["trees_digest"] for r in independent + lockstep}
        out[scheme] = {
            "independent": {k: ind[k] for k in keys}, "lockstep": {k: lock[k] for k in keys},
            "independent_seconds_all": [r[scheme]["seconds"] for r in independent],
            "lockstep_seconds_all": [r[scheme]["seconds"] for r in lockstep],
            "independent_over_lockstep_seconds": round(ind["seconds"] / lock["seconds"], 3),
            "independent_over_lockstep_engine_steps": round(ind["engine_steps"] / lock["engine_steps"], 3),
            "same_trajectories": len(digests) == 1,
        }
    return out


def run_vllm_scheduling(served: Any, policy: HFPolicy, env: ToolEnvironment, tasks: list,
                        args: argparse.Namespace, independent: dict) -> dict:
    """``vllm.scheduling``: two runs of each schedule per workload in ABBA order (the uniform
    workload's first independent run is the one already made), fastest of each compared; then
    the same on ragged turns (the ragged weights pushed into the same engine)."""
    lockstep = [run_schemes(served, env, tasks, args, "lockstep") for _ in range(2)]
    again = run_schemes(served, env, tasks, args, "independent")
    out = {"uniform_turns": compare_scheduling([independent, again], lockstep)}
    if args.ragged_eos_logit > 0:
        eos = policy.tokenizer.eos_token_id
        served.sync_weights(ragged_model(policy.model, eos, args.ragged_eos_logit), version=1)
        runs: dict[str, list[dict]] = {"independent": [], "lockstep": []}
        for scheduling in ("lockstep", "independent", "independent", "lockstep"):
            runs[scheduling].append(run_schemes(served, env, tasks, args, scheduling))
        out["ragged_turns"] = compare_scheduling(runs["independent"], runs["lockstep"])
        out["ragged_turns"]["eos_logit"] = args.ragged_eos_logit
    return out


def vllm_policy(policy: HFPolicy, args: argparse.Namespace) -> tuple[Any, float]:
    """The same model and tokenizer served by vLLM (imported here: an optional extra)."""
    from tracerl.models.vllm_backend import VLLMPolicy

    if args.threads:  # keep torch's thread count instead of vLLM's own core binding
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    start = time.perf_counter()
    served = VLLMPolicy(policy.model, policy.tokenizer, max_model_len=2048, seed=0, enforce_eager=args.vllm_eager,
                        block_size=args.vllm_block_size)
    return served, time.perf_counter() - start


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    world = build_world(WorldConfig(num_train=args.tasks, num_test=0, max_hops=2))
    if args.model:
        policy = HFPolicy.from_pretrained(args.model, device=args.device)
    else:
        texts = [f"{d.title} {d.text}" for d in world.documents] + [t.question for t in world.train]
        texts.append("Thought: Action: search[ ] open[ ] answer[ ] Observation: Error: Valid actions: query title text , .")
        policy = random_policy(texts, args.hidden, args.layers, args.preset)
        dtype = torch.bfloat16 if args.device.startswith("cuda") and args.preset != "small" else torch.float32
        policy.model.to(device=args.device, dtype=dtype)
    if args.no_prefix_cache:
        policy.store = None
    policy.decode_engine = decode_engine(SimpleNamespace(decode_engine=args.decode_engine), policy.model)
    params = sum(p.numel() for p in policy.model.parameters())
    index = SearchIndex(world.documents, use_cache=False)
    env = ToolEnvironment(search_tools(index, top_k=2, max_tokens=40), EnvConfig(max_turns=args.max_turns))
    tasks = world.train[: args.tasks]
    results: dict[str, Any] = {}
    for backend in args.backends:
        if backend == "hf":
            results["hf"] = run_schemes(policy, env, tasks, args)
        else:
            served, start_s = vllm_policy(policy, args)
            results["vllm"] = run_schemes(served, env, tasks, args, "independent")
            results["vllm"]["engine_start_s"] = round(start_s, 1)
            results["vllm"]["torch_threads"] = torch.get_num_threads()
            results["vllm"]["scheduling"] = run_vllm_scheduling(served, policy, env, tasks, args, results["vllm"])
            served.close()
    from tracerl.testbed.provenance import provenance  # base model sha256 and machine facts for the JSON

    setup = {
        "provenance": provenance(args.model or None),
        "model": args.model or f"random Qwen3 preset={args.preset} hidden={policy.model.config.hidden_size} "
        f"layers={policy.model.config.num_hidden_layers}",
        "parameters": params, "vocab": len(policy.tokenizer), "tasks": len(tasks),
        "leaves_per_task": args.leaves, "roots_per_task": args.roots, "max_turns": args.max_turns,
        "max_turn_tokens": args.turn_tokens, "device": args.device, "threads": args.threads or torch.get_num_threads(),
        "prefix_cache": not args.no_prefix_cache, "decode_engine": f"{args.decode_engine} ({policy.decode_engine})",
        "machine": platform.processor() or platform.machine(),
    }
    if args.backends == ["hf"]:  # the original file's layout, keys unchanged
        result = {**results["hf"], "setup": setup}
        result.pop("branching_vs_chains_seconds_per_leaf")
        for scheme in ("chains", "branching"):
            result[scheme].pop("trees_digest")
    else:
        setup["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
        setup["vllm_eager"] = args.vllm_eager
        setup["vllm_block_size"] = args.vllm_block_size
        result = {"backends": results, "setup": setup, "git": git_state()}  # git: the commit measured (issue 48)
        if "hf" in results and "vllm" in results:
            result["vllm_over_hf_generated_tokens_per_s"] = {
                scheme: round(results["vllm"][scheme]["generated_tokens_per_s"] / results["hf"][scheme]["generated_tokens_per_s"], 3)
                for scheme in ("chains", "branching")
            }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
