"""Rollout engine throughput, and tokens saved by branching vs independent chains at equal leaves.

Runs the real engine (SynthWiki world, bm25 search tool, react format) with a small Qwen3
policy: a pretrained folder given with ``--model`` (e.g. the embedded tiny model), otherwise a
randomly initialised model over a word-level vocabulary of the world. Two schemes reach the
same number of leaves per task:

- ``chains``: ``leaves`` independent chains per task;
- ``branching``: ``roots`` chains per task, then the remaining leaves as continuations from the
  deepest open boundaries of those chains (``RolloutEngine.expand``), which resume from the
  stored prefix instead of regenerating it.

    python benchmarks/rollout_throughput.py [--quick] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
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
from tracerl.rollout.engine import EngineConfig, RolloutCost, RolloutEngine


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Fewer tasks and shorter turns.")
    parser.add_argument("--model", default=None, help="Pretrained model folder (default: random model).")
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
    parser.add_argument("--no-prefix-cache", action="store_true", help="Disable the cross-call KV store.")
    parser.add_argument("--out", default="benchmarks/results/rollout_throughput.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.tasks, args.turn_tokens = 4, 16
    world = build_world(WorldConfig(num_train=args.tasks, num_test=0, max_hops=2))
    fmt = get_format("react")
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
    params = sum(p.numel() for p in policy.model.parameters())
    index = SearchIndex(world.documents, use_cache=False)
    env = ToolEnvironment(search_tools(index, top_k=2, max_tokens=40), EnvConfig(max_turns=args.max_turns))
    config = EngineConfig(max_turns=args.max_turns, max_turn_tokens=args.turn_tokens, max_total_tokens=1024)
    tasks = world.train[: args.tasks]
    gen = torch.Generator(device=args.device).manual_seed(0)

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
        return {
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
        }

    chain_summary = summary(chain_cost, chain_s, chains, stats0, stats1)
    tree_summary = summary(tree_cost, root_s + branch_s, roots, stats1, stats2)
    saved = 1 - tree_summary["generated_tokens_per_leaf"] / chain_summary["generated_tokens_per_leaf"]
    result = {
        "chains": chain_summary,
        "branching": tree_summary,
        "tokens_saved_per_leaf": round(chain_summary["generated_tokens_per_leaf"] - tree_summary["generated_tokens_per_leaf"], 2),
        "tokens_saved_fraction": round(saved, 3),
        "setup": {
            "model": args.model or f"random Qwen3 preset={args.preset} hidden={policy.model.config.hidden_size} "
            f"layers={policy.model.config.num_hidden_layers}",
            "parameters": params, "vocab": len(policy.tokenizer), "tasks": len(tasks),
            "leaves_per_task": args.leaves, "roots_per_task": args.roots, "max_turns": args.max_turns,
            "max_turn_tokens": args.turn_tokens, "device": args.device, "threads": torch.get_num_threads(),
            "prefix_cache": not args.no_prefix_cache,
            "machine": platform.processor() or platform.machine(),
        },
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
