"""Per-call overhead of running a tool isolated (a killable worker process) vs in-process.

Usage: python benchmarks/systems/tool_isolation.py [--calls 2000]
Writes benchmarks/results/tool_isolation.json. Not a test: numbers depend on the machine.

Three ways of calling the same tool through ``ToolSet.call``: in-process without a timeout,
in-process with a timeout (a daemon thread per call), and isolated (``Tool.isolated``: one pipe
round trip to the worker process, see tracerl/envs/isolation.py); for a short result and for a
4 kB one (about a 256-token observation). Also: the time to replace a worker killed at a timeout.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from tracerl.envs.isolation import shared_worker
from tracerl.envs.tools import Tool, ToolFailure, ToolSet


def echo(query: str) -> str:
    """Repeat the query."""
    return query


def page(query: str) -> str:
    """A 4 kB observation."""
    return (query + " ") * (4096 // (len(query) + 1))


def hang(query: str) -> str:
    """Never answers in time."""
    time.sleep(60)
    return "late"


def per_call_us(tools: ToolSet, name: str, calls: int, timeout_s: float | None) -> dict[str, float]:
    tools.call(name, {"query": "warm up"}, timeout_s=timeout_s)  # starts the worker when isolated
    times = []
    for i in range(calls):
        start = time.perf_counter()
        tools.call(name, {"query": f"query {i}"}, timeout_s=timeout_s)
        times.append((time.perf_counter() - start) * 1e6)
    ordered = sorted(times)
    return {"median_us": statistics.median(times), "mean_us": statistics.fmean(times),
            "p95_us": ordered[int(0.95 * len(ordered))]}


def replacement_ms(tools: ToolSet, rounds: int) -> float:
    """Time of the first call after a worker was killed at a timeout (a fresh worker starts)."""
    times = []
    for _ in range(rounds):
        try:
            tools.call("hang", {"query": "q"}, timeout_s=0.01)
        except ToolFailure:
            pass
        start = time.perf_counter()
        tools.call("echo", {"query": "q"})
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "tool_isolation.json")
    args = parser.parse_args()
    inline = ToolSet([echo, page])
    isolated = ToolSet([Tool.from_function(f, isolated=True) for f in (echo, page, hang)])
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in ("echo", "page"):
        results[name] = {
            "in_process": per_call_us(inline, name, args.calls, None),
            "in_process_timeout_thread": per_call_us(inline, name, args.calls, 30.0),
            "isolated": per_call_us(isolated, name, args.calls, 30.0),
        }
    first_start = time.perf_counter()
    shared_worker().close()
    isolated.call("echo", {"query": "q"})
    data = {
        "calls": args.calls,
        "per_call": results,
        "overhead_isolated_vs_in_process_us": {
            name: results[name]["isolated"]["median_us"] - results[name]["in_process"]["median_us"] for name in results},
        "worker_restart_after_close_ms": (time.perf_counter() - first_start) * 1e3,
        "worker_replacement_after_timeout_ms": replacement_ms(isolated, 10),
        "machine": {"machine": platform.machine(), "python": platform.python_version()},
    }
    from tracerl.testbed.provenance import provenance  # imported after the timings: it loads torch

    data["provenance"] = provenance(None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
