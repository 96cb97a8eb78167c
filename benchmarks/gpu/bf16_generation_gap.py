"""Log-prob gap between the rollout sampler and the trainer, per ``model.generation_dtype``.

Runs real seeded rollouts (SynthWiki world, bm25 search tool, react format, the embedded tiny
model) through the HF backend, then recomputes every sampled token's log-prob with the trainer's
model through the importance-sampling guard (``with_trainer_logprobs``, the call behind
``optim.recompute_old_logprobs``), which reports ``logprob_mismatch_mean_abs`` / ``_max``: the
numbers a run logs each step. Arms (sampler -> trainer):

- ``auto_fp32``: shared fp32 model -> fp32 (today's default; only kernel/padding rounding);
- ``bf16_copy_fp32``: a bf16 copy, no autocast -> fp32 trainer;
- ``bf16_copy_autocast``: a bf16 copy -> fp32 master weights under bf16 autocast (``model.dtype = bfloat16``).

    python benchmarks/gpu/bf16_generation_gap.py [--tasks 8] [--leaves 4] [--out FILE]

Also runs on CUDA (``--device cuda``); the CPU numbers are what docs may quote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from tracerl.agent.formats import get_format
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.testbed.loading import load_model
from tracerl.train.update import UpdateSettings, with_trainer_logprobs


def rollouts(policy: HFPolicy, args: argparse.Namespace) -> list[Any]:
    world = build_world(WorldConfig(num_train=args.tasks, num_test=0, max_hops=2))
    env = ToolEnvironment(search_tools(SearchIndex(world.documents, use_cache=False), top_k=2, max_tokens=40),
                          EnvConfig(max_turns=3))
    engine = RolloutEngine(policy, env, get_format("react"), exact_match,
                           EngineConfig(max_turns=3, max_turn_tokens=48, max_total_tokens=1024))
    trees, _ = engine.rollout(world.train[: args.tasks], [args.leaves] * args.tasks, seed=0)
    return [t for tree in trees for t in tree.trajectories.values()]


def gap(model: Any, trajectories: list[Any], pad_id: int, dtype: str) -> dict[str, float]:
    settings = UpdateSettings(8, 1.0, 0.2, 0.2, 0.0, "token-mean", 1.0, dtype=dtype)
    with torch.no_grad():
        _, metrics = with_trainer_logprobs(model, trajectories, settings, pad_id)
    return {k: round(v, 6) for k, v in metrics.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--leaves", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bf16_generation_gap.json"))
    args = parser.parse_args()
    model, tok = load_model("tiny", device=args.device)
    shared = rollouts(HFPolicy(model, tok), args)
    copied = rollouts(HFPolicy(model, tok, generation_dtype=torch.bfloat16), args)
    tokens = sum(sum(t.sampled) for t in copied)
    result = {
        "model": "embedded tiny (testbed preset default)", "device": args.device, "torch": torch.__version__,
        "trajectories": len(copied), "sampled_tokens_bf16_arm": tokens,
        "auto_fp32": gap(model, shared, tok.pad_token_id, "float32"),
        "bf16_copy_fp32": gap(model, copied, tok.pad_token_id, "float32"),
        "bf16_copy_autocast": gap(model, copied, tok.pad_token_id, "bfloat16"),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
