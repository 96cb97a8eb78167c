"""Quick check of concurrent tool calls (issue 46): the built-in bm25s search with a fixed latency
added to every call (an event wait: sleeping, not spinning), ``grpo`` on the embedded tiny model,
one step, the rollout phase's seconds per arm, and whether the trees equal the serial arm's.

Usage: TRACERL_THREADS=1 python benchmarks/systems/tool_concurrency.py [--latency-ms 300] [--budget 64]

Arms (``--set`` keys of ``rollout.engine``): ``serial`` (``tool_concurrency=0``: each call in turn
on the driver, the path before issue 46), ``concurrent`` (the defaults: 16 calls in flight, lockstep
turns) and ``independent`` (``hf_scheduling=independent``: an episode whose observation arrived
generates its next turn without waiting for the others). Not a test: the seconds depend on the
machine (read the ratios); the full benchmark with a served retriever is ``tool_latency.py``.

PREDICTION: serial grows by (tool calls) x latency (about 120 calls: +36 s at 300 ms); concurrent by
(tool rounds) x latency (a handful of rounds: +1-2 s); independent about the same as concurrent;
trees equal in all arms.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

ARMS = {"serial": ["rollout.engine.tool_concurrency=0"], "concurrent": [],
        "independent": ["rollout.engine.hf_scheduling=independent"]}


def register(latency_s: float) -> str:
    """Register ``slow_search``: the built-in environment, each call ``latency_s`` late."""
    from tracerl.envs.base import ToolEnvironment
    from tracerl.envs.environments import ENVIRONMENTS, EnvSettings, search
    from tracerl.envs.tools import Tool, ToolSet

    @ENVIRONMENTS.register("slow_search")
    def slow_search(documents: Any, settings: EnvSettings) -> ToolEnvironment:
        env = search(documents, settings)
        fast = env.tools

        def late(name: str) -> Tool:
            def call(**kwargs: Any) -> str:
                threading.Event().wait(latency_s)
                return fast.call(name, kwargs)
            tool = fast[name]
            return Tool(name, tool.description, tool.parameters, call)

        env.tools = ToolSet([late("search"), late("open")])
        return env

    return "slow_search"


def one_step(arm: str, run: Path, budget: int) -> dict[str, Any]:
    from tracerl.train.api import trainer

    sets = ["data.environment=slow_search", f"rollout.budget={budget}", "eval.every=0", "eval.size=1",
            "log.plot=false", *ARMS[arm]]
    with trainer("grpo", run, overrides=sets, steps=1, quiet=True, overwrite=True) as training:
        record = training.step()
    rows = gzip.decompress((run / "rollouts" / "step-000001.jsonl.gz").read_bytes())
    return {"rollout_s": round(float(record["time_rollout_execute"]), 2), "tool_calls": record["tool_calls"],
            "generated_tokens": record["generated_tokens"], "_rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--budget", type=int, default=64)
    args = parser.parse_args()
    register(args.latency_ms / 1000)
    out: dict[str, Any] = {"latency_ms": args.latency_ms, "budget": args.budget, "preset": "grpo", "arms": {}}
    with tempfile.TemporaryDirectory() as work:
        for arm in ARMS:
            out["arms"][arm] = one_step(arm, Path(work) / arm, args.budget)
    serial = out["arms"]["serial"].pop("_rows")
    for arm in ("concurrent", "independent"):
        out["arms"][arm]["trees_equal_serial"] = out["arms"][arm].pop("_rows") == serial
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
