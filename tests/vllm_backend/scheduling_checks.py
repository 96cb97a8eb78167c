"""Independent vs lockstep scheduling of the vLLM backend, measured on one engine.

``vllm_checks.py`` calls :func:`scheduling_facts` with its engine (one engine start serves every
check); ``test_vllm_backend.py`` judges the facts. Run alone for a quick look:

    .venv-vllm/bin/python tests/vllm_backend/scheduling_checks.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from tracerl.agent.formats import get_format  # noqa: E402
from tracerl.envs.base import EnvConfig, ToolEnvironment  # noqa: E402
from tracerl.envs.search import SearchIndex, search_tools  # noqa: E402
from tracerl.envs.synthwiki import WorldConfig, build_world  # noqa: E402
from tracerl.envs.verifiers import exact_match  # noqa: E402
from tracerl.rollout.engine import EngineConfig, RolloutEngine  # noqa: E402
from tracerl.core.protocol import ExpandRequest, StartRequest, task_record, to_json  # noqa: E402
from tracerl.rollout.executor import LocalExecutor  # noqa: E402

WORLD = WorldConfig(num_people=20, num_cities=10, num_countries=4, num_books=10, num_bands=6,
                    num_companies=8, num_train=6, num_test=0, max_hops=2)
EOS_STRENGTH = 6.0
"""EOS logit ~ 6 x N(0, 1) by context (see :func:`ragged_model`): turns of 1 to 24 tokens."""


def ragged_model(model: Any, eos: int, strength: float = EOS_STRENGTH) -> Any:
    """``model`` with EOS made likely in some contexts: embedding column 0 is zero for every
    token but EOS, whose entry is ``strength``; the EOS logit is then ``strength`` times the final
    hidden state's component 0 (RMS-normed, ~N(0, 1)), every other logit stays ~0.1. Turns end
    at EOS after a context-dependent number of tokens, so episodes drift apart in time (a random
    model without it writes every turn to its token limit)."""
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 0.0
        emb[eos, 0] = strength
    return model


def _strip_logprobs(record: Any) -> tuple[Any, list[float]]:
    """A JSON-able record without its ``logprobs`` lists, and those lists' values in order."""
    found: list[float] = []

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if k == "logprobs":
                    found.extend(v)
                else:
                    out[k] = walk(v)
            return out
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(record), found


def _run(policy: Any, env: ToolEnvironment, tasks: list, scheduling: str, config: dict) -> dict:
    """Start 3 chains per task, then 2 continuations from depths 1 and 2 of each tree's first chain."""
    engine = RolloutEngine(policy, env, get_format("react"), exact_match,
                           EngineConfig(vllm_scheduling=scheduling, **config))
    executor = LocalExecutor(engine)
    steps0, requests0 = policy.stats["engine_steps"], policy.stats["requests"]
    clock = time.perf_counter()
    started = executor.start([StartRequest(f"t{i}", task_record(t), 3, seed=11) for i, t in enumerate(tasks)])
    requests = []
    for delta in started.deltas:
        tree = engine.tree(delta.tree_id)
        first_leaf = min(tree.trajectories)
        for node in tree.trajectories[first_leaf].node_path[1:3]:
            if engine.can_expand(delta.tree_id, node):
                requests.append(ExpandRequest(delta.tree_id, node, 2, seed=12))
    expanded = executor.expand(requests)
    seconds = time.perf_counter() - clock
    records = [{"deltas": json.loads(to_json(r))["deltas"], "cost": [r.rollouts, r.generated_tokens]}
               for r in (started, expanded)]  # not the calls' seconds and backend counters
    structure, logprobs = _strip_logprobs(records)
    trees = [engine.tree(d.tree_id) for d in started.deltas]
    return {
        "structure": structure, "logprobs": logprobs,
        "requests": [(r.tree_id, r.node_id, r.k) for r in requests],
        "leaves": sum(len(t.trajectories) for t in trees),
        "turns": sum(len(t.nodes) - 1 for t in trees),
        "turn_lengths": sorted({len(n.turn.assistant_ids) for t in trees for n in t.nodes if n.turn}),
        "engine_steps": policy.stats["engine_steps"] - steps0,
        "backend_requests": policy.stats["requests"] - requests0,
        "generated_tokens": started.generated_tokens + expanded.generated_tokens,
        "schedule": vars(engine.schedule),
        "seconds": round(seconds, 3),
    }


def scheduling_facts(policy: Any, tok: Any, make_model: Any) -> dict:
    """Push a ragged-turn model into ``policy`` and run the same requests in both schedules.

    ``make_model(tok, seed)`` builds a random model vLLM's CPU attention accepts."""
    policy.sync_weights(ragged_model(make_model(tok, 5), tok.eos_token_id), version=10)
    world = build_world(WORLD)
    env = ToolEnvironment(search_tools(SearchIndex(world.documents, use_cache=False), top_k=2, max_tokens=30),
                          EnvConfig(max_turns=4))
    config = dict(max_turns=4, max_turn_tokens=24, max_total_tokens=600, temperature=1.0)
    tasks = world.train[:4]
    lock = _run(policy, env, tasks, "lockstep", config)
    ind = _run(policy, env, tasks, "independent", config)
    pairs = list(zip(lock["logprobs"], ind["logprobs"], strict=True))
    return {
        "abort": _abort_check(policy, tok),
        "structure_equal": lock["structure"] == ind["structure"],
        "requests_equal": lock["requests"] == ind["requests"],
        "logprob_count": [len(lock["logprobs"]), len(ind["logprobs"])],
        "logprob_max_abs_diff": max((abs(a - b) for a, b in pairs), default=float("inf")),
        "differing_records": _differences(lock["structure"], ind["structure"]),
        **{f"{name}_{key}": run[key] for name, run in (("lockstep", lock), ("independent", ind))
           for key in ("leaves", "turns", "backend_requests", "engine_steps", "generated_tokens", "schedule", "seconds", "turn_lengths")},
        "expand_requests": len(lock["requests"]),
    }


def _abort_check(policy: Any, tok: Any) -> dict:
    """Two requests submitted, one engine step, both aborted: the engine is left idle (a prefix
    cache reset, which refuses while requests run, succeeds) and generate() works again."""
    from tracerl.models.backend import SamplingParams

    prefix = tok.encode("The city of Lumen lies on", add_special_tokens=False)
    long = SamplingParams(max_new_tokens=200, temperature=1.0)
    ids = [policy.submit(prefix, long, seed) for seed in (1, 2)]
    finished = policy.poll()
    policy.abort(ids)
    policy.clear_prefix_cache()
    after = policy.generate([prefix], SamplingParams(max_new_tokens=4), seeds=[3])
    return {"distinct_ids": len(set(ids)) == 2, "finished_in_one_step": len(finished),
            "idle": not policy.llm.llm_engine.has_unfinished_requests(), "generate_after": len(after[0].token_ids)}


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two JSON records differ (first 10), to say what disagreed."""
    if type(a) is not type(b) or (not isinstance(a, (dict, list)) and a != b):
        return [path or "/"]
    out: list[str] = []
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            out += _differences(a.get(k), b.get(k), f"{path}/{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            return [f"{path} (length {len(a)} vs {len(b)})"]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _differences(x, y, f"{path}/{i}")
    return out[:10]


def main() -> None:
    from helpers_tiny import bpe_tokenizer
    from vllm_checks import vllm_model

    from tracerl.models.vllm_backend import VLLMPolicy

    tok = bpe_tokenizer()
    policy = VLLMPolicy(vllm_model(tok, 0), tok, max_model_len=1024, enforce_eager=True)
    facts = scheduling_facts(policy, tok, vllm_model)
    policy.close()
    print("RESULT " + json.dumps(facts))


if __name__ == "__main__":
    main()
