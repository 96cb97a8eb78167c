"""Tool latency (issue 46, Measure): one step's rollout phase against a served retriever whose every
request waits 0, 50, 500 or 2,000 ms, on today's serial path and on the concurrent one, in one run.

Usage: TRACERL_THREADS=1 python benchmarks/systems/tool_latency.py [--latencies 0,50,500,2000] [--budget 64]
       [--in-flight 1000] [--repeats 2]
Writes benchmarks/results/tool_latency.json. Not a test: numbers depend on the machine, which is
shared and noisy (2 cores), so read the ratios of arms measured side by side at one latency, not the
absolute seconds; each latency's arms run interleaved against one server, ``--repeats`` times below
2 s (the fastest run of each arm is kept, every run is listed).

Setup: the demo's world (``tracerl demo``: SynthWiki at the embedded model's sizes, one- and
two-hop questions, ``data.search_top_k=2``, group size 8) written as files; ``tracerl
serve-retriever --latency-ms L`` as a subprocess on 127.0.0.1 (the latency is the server's test
injection, per request, so a batch of queries waits once); ``data.environment=http_search``; the
embedded tiny model; the ``trace`` preset at ``rollout.budget=64`` (pool 16); one step. Arms:

- ``serial``: ``rollout.engine.tool_concurrency=0``, lockstep (the path before issue 46: each
  call in turn on the driver);
- ``concurrent``: the defaults (``tool_concurrency=16``, lockstep HF scheduling: the turn round
  waits for its slowest call, but the calls of a round overlap and are batched into few requests);
- ``concurrent_64``: lockstep with ``tool_concurrency=64`` (every call of a round in flight at once);
- ``independent``: ``tool_concurrency=64`` and ``rollout.engine.hf_scheduling=independent`` (an
  episode whose observation arrived generates again without waiting for the others).

Recorded per arm: the rollout phase (``time_rollout_execute``; ``time_rollout`` adds the readiness
scoring, which has no tool in it), the queries in flight (peak, counted by the client from the moment a
request is made to its answer, a wait for a pooled connection included: a batch of 10 counts 10), HTTP requests, generated tokens per second of the phase, the
process's peak RSS during the step, and whether the step's trees (every node's text, observation,
action, parent and reward) equal the serial 0 ms arm's.

Also: ``--in-flight`` tool calls at once (1,000) against a server waiting 1 s per request, through the
engine's tool runner, with and without the batch form, three rounds: peak RSS, threads and open file
descriptors during and after each round (a leak would grow them round after round).

PREDICTION (written before the first run):
- serial: the phase grows by (the step's tool calls) x L: about 60-100 calls at this budget, so
  +30-50 s at 500 ms and +2-3 minutes at 2 s; 2 s makes it 20-40x the 0 ms phase.
- concurrent (lockstep): the phase grows by (turn rounds that call a tool) x L, about the longest
  episode's tool calls (stage 1 plus its continuation: 3-6), i.e. +2-3 s at 500 ms: within 1.5x of
  (the 0 ms phase + the longest episode's sum of latencies), the goal. Batching folds a round's
  calls into one or a few requests.
- independent: at or a little under lockstep (rounds stop being synchronised), same trees.
- trees: equal in every arm and at every latency (the latency changes no token).
- 1,000 in flight: the round takes about one latency plus overhead with the batch form (16 requests of
  at most 64 queries), a few latencies without it (the connection pool holds 256); memory grows by
  the pool's threads' stacks (tens of MB) and returns; threads and fds back to the baseline after each
  round.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "tool_latency.json"
ARMS: dict[str, list[str]] = {
    "serial": ["rollout.engine.tool_concurrency=0", "rollout.engine.hf_scheduling=lockstep"],
    "concurrent": [],
    "concurrent_64": ["rollout.engine.tool_concurrency=64", "rollout.engine.hf_scheduling=lockstep"],
    "independent": ["rollout.engine.tool_concurrency=64", "rollout.engine.hf_scheduling=independent"],
}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextmanager
def peaks(every_s: float = 0.01) -> Iterator[dict[str, float]]:
    """Peak RSS (MB), threads and fds of this process while the block runs (sampled)."""
    out = {"rss_mb": rss_mb(), "threads": threading.active_count(), "fds": open_fds()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            out["rss_mb"] = max(out["rss_mb"], rss_mb())
            out["threads"] = max(out["threads"], threading.active_count() - 1)
            out["fds"] = max(out["fds"], open_fds())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        stop.set()
        sampler.join()


@contextmanager
def served(corpus: Path, latency_ms: float) -> Iterator[str]:
    """``tracerl serve-retriever`` as a subprocess; yields its URL once it listens."""
    cmd = [sys.executable, "-c", "from tracerl.cli import main; main()", "serve-retriever", "--corpus", str(corpus),
           "--port", "0", "--latency-ms", str(latency_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("serving "):
            raise RuntimeError(f"serve-retriever did not start: {line}{proc.stdout.read()}")
        yield line.split(" on ", 1)[1].split()[0]
    finally:
        proc.kill()
        proc.wait(30)


def write_data(out: Path) -> dict[str, Path]:
    """The demo's first training world as tasks and corpus files."""
    from tracerl.envs.synthwiki import build_world, write_world
    from tracerl.train.demo import demo_config

    data = demo_config().data
    return write_world(build_world(replace(data.world, fact_seed=data.first_fact_seed)), out)


def tree_key(rows: list[dict[str, Any]]) -> list[Any]:
    """What must not change with the schedule: every node's place, text, observation and reward."""
    return [[r["tree_id"], [(n["id"], n["parent"], n["text"], n["observation"], n["action"], n["reward"])
                            for n in r["nodes"]]] for r in rows]


def longest_calls(rows: list[dict[str, Any]]) -> int:
    """Tool calls on the longest root-to-leaf path (a continuation's path includes its prefix)."""
    best = 0
    for r in rows:
        action = {n["id"]: n["action"] for n in r["nodes"]}
        for t in r["trajectories"]:
            best = max(best, sum(action[i] == "tool" for i in t["node_path"]))
    return best


def one_step(arm: str, url: str, data: dict[str, Path], run: Path, budget: int) -> dict[str, Any]:
    from tracerl.train.api import trainer
    from tracerl.train.demo import DEMO_OVERRIDES

    keep = [o for o in DEMO_OVERRIDES if o.split("=")[0] in ("data.search_top_k", "rollout.schemes.group_size")]
    sets = [*keep, f"rollout.budget={budget}", f"rollout.pool_size={budget // 4}", "data.source=files",
            f"data.tasks={data['train']}", "data.environment=http_search", f"data.retriever_url={url}",
            "eval.every=0", "eval.size=1", "log.plot=false", *ARMS[arm]]
    with trainer("trace", run, overrides=sets, steps=1, quiet=True, overwrite=True) as training:
        client = training.data.environment._envs[0].retriever  # the http_search environment's client
        with peaks() as peak:
            record = training.step()
    rows = [json.loads(line) for line in gzip.open(run / "rollouts" / "step-000001.jsonl.gz", "rt")] \
        if (run / "rollouts" / "step-000001.jsonl.gz").exists() else []
    phase = float(record["time_rollout_execute"])
    return {"rollout_s": round(phase, 3), "rollout_with_scoring_s": round(float(record["time_rollout"]), 3),
            "tool_calls": record["tool_calls"], "tool_failures": record["tool_failures"],
            "queries_in_flight_peak": client.counts.peak_in_flight, "http_requests": client.counts.requests,
            "generated_tokens": record["generated_tokens"],
            "tokens_per_s": round(float(record["generated_tokens"]) / phase, 1),
            "peak_rss_mb": round(peak["rss_mb"], 1), "_rows": rows}


def latency_table(data: dict[str, Path], work: Path, latencies: list[float], budget: int,
                  repeats: int = 1) -> dict[str, Any]:
    """Per latency and arm, the fastest of ``repeats`` runs (below 2 s; one run at 2 s and above),
    the arms interleaved within each repeat so that the machine's noise falls on all of them."""
    out: dict[str, Any] = {}
    reference: list[Any] | None = None
    for latency in latencies:
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        with served(data["corpus"], latency) as url:
            for _ in range(repeats if latency < 2000 else 1):
                for arm in ARMS:
                    result = one_step(arm, url, data, work / f"{arm}-{latency:g}", budget)
                    rows = result.pop("_rows")
                    if rows:
                        key = tree_key(rows)
                        reference = key if reference is None else reference
                        result["trees_equal_serial_0ms"] = key == reference
                        result["longest_episode_tool_calls"] = longest_calls(rows)
                    runs[arm].append(result)
                    print(f"{latency:>6g} ms {arm:<13} {json.dumps(result)}", flush=True)
        row: dict[str, Any] = {}
        for arm, results in runs.items():
            best = dict(min(results, key=lambda r: r["rollout_s"]))
            best["rollout_s_runs"] = [r["rollout_s"] for r in results]
            best["trees_equal_serial_0ms"] = all(r.get("trees_equal_serial_0ms", False) for r in results)
            row[arm] = best
        out[f"{latency:g}"] = row
    return out


def goal(table: dict[str, Any], latency: str = "500") -> dict[str, Any]:
    """At 500 ms: concurrent phase <= 1.5 x (0 ms phase + longest episode's calls x 0.5 s)?"""
    if latency not in table or "0" not in table:
        return {}
    found: dict[str, Any] = {}
    seconds = float(latency) / 1000
    for arm in (a for a in ARMS if a != "serial" and a in table[latency]):
        calls = table[latency][arm].get("longest_episode_tool_calls", 0)
        phase, zero = table[latency][arm]["rollout_s"], table["0"][arm]["rollout_s"]
        bound = zero + calls * seconds
        # how many latencies the phase waited one after another (the critical path in tool waits):
        # a staged allocation (TRACE expands after stage 1's outcomes) and lockstep rounds add waits
        # beyond the longest episode's own calls
        found[arm] = {"rollout_s": phase, "bound_s": round(bound, 3), "ratio": round(phase / bound, 3),
                      "met": phase <= 1.5 * bound, "sequential_latency_waits": round((phase - zero) / seconds, 1),
                      "longest_episode_tool_calls": calls}
    return found


def in_flight(corpus: Path, calls: int, rounds: int = 3) -> dict[str, Any]:
    """``calls`` search calls at once through the tool runner, server waiting 1 s per request."""
    from tracerl.core.types import Action, Task
    from tracerl.envs.base import EnvConfig, ToolEnvironment
    from tracerl.envs.http_search import http_search_environment
    from tracerl.envs.tools import Tool, ToolSet
    from tracerl.rollout.tool_calls import ToolRunner

    out: dict[str, Any] = {}
    with served(corpus, 1000) as url:
        for batched in (True, False):
            env = http_search_environment(url, 2, EnvConfig(tool_timeout_s=60.0))
            client = env.retriever
            if not batched:  # the single form only: one HTTP request per call (same client)
                env = ToolEnvironment(ToolSet([Tool.from_function(env.tools["search"].fn)]), env.config)
            base = {"rss_mb": round(rss_mb(), 1), "threads": threading.active_count(), "fds": open_fds()}
            per_round = []
            for _ in range(rounds):
                episodes = [env.start(Task(f"t{i}", "q?", ("a",))) for i in range(calls)]
                requests, client.counts.peak_in_flight = client.counts.requests, 0
                start = time.perf_counter()
                with peaks() as peak:
                    with ToolRunner(min(calls, 1024)) as runner:
                        futures = [runner.submit(e, Action(kind="tool", name="search",
                                                           arguments={"query": f"Thikir {i}"}))
                                   for i, e in enumerate(episodes)]
                        failed = sum(f.result().infra_failed for f in futures)
                        peak_runner = runner.peak_in_flight
                wall = time.perf_counter() - start
                del episodes, futures
                gc.collect()
                per_round.append({"wall_s": round(wall, 2), "failed": failed, "calls_in_flight_peak": peak_runner,
                                  "queries_at_server_peak": client.counts.peak_in_flight,
                                  "http_requests": client.counts.requests - requests,
                                  "peak_rss_mb": round(peak["rss_mb"], 1), "peak_threads": peak["threads"],
                                  "peak_fds": peak["fds"], "after_rss_mb": round(rss_mb(), 1),
                                  "after_threads": threading.active_count(), "after_fds": open_fds()})
                print(f"in flight {calls} batched={batched}: {per_round[-1]}", flush=True)
            client.close()
            out["batched" if batched else "single"] = {"baseline": base, "rounds": per_round}
    return out


def markdown(result: dict[str, Any]) -> str:
    """The docs' latency table (docs/tools-over-the-network.md) from a results file."""
    arms = [a for a in next(iter(result["latency_ms"].values())) if a != "serial"]
    lines = ["| latency per request | serial s | " + " | ".join(f"{a} s (x serial)" for a in arms)
             + " | HTTP requests (serial / concurrent) | peak queries in flight (concurrent arms) | trees equal |",
             "|---" * (len(arms) + 5) + "|"]
    for latency, row in result["latency_ms"].items():
        serial = row["serial"]
        cells = [f"{row[a]['rollout_s']:.1f} ({row[a]['rollout_s'] / serial['rollout_s']:.2f})" for a in arms if a in row]
        peak = " / ".join(str(row[a]["queries_in_flight_peak"]) for a in arms if a in row)
        equal = all(row[a].get("trees_equal_serial_0ms") for a in row)
        lines.append(f"| {latency} ms | {serial['rollout_s']:.1f} | {' | '.join(cells)} | {serial['http_requests']} / "
                     f"{row['concurrent']['http_requests']} | {peak} | {'yes' if equal else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latencies", default="0,50,500,2000", help="Injected ms per request, comma-separated.")
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2, help="Runs per arm below 2 s (the fastest is kept).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tracerl-tool-latency"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true", help="Print the markdown table of --out and exit.")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.out.read_text())))
        return
    import platform

    args.work.mkdir(parents=True, exist_ok=True)
    data = write_data(args.work / "world")
    table = latency_table(data, args.work, [float(x) for x in args.latencies.split(",")], args.budget,
                          args.repeats)
    result = {
        "what": "one trace step's rollout phase (rollout.budget=%d) against tracerl serve-retriever with an "
                "injected per-request latency: serial vs concurrent tool calls" % args.budget,
        "command": "TRACERL_THREADS=1 python benchmarks/systems/tool_latency.py --repeats %d" % args.repeats,
        "threads": os.environ.get("TRACERL_THREADS"), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "noisy_machine_note": "shared 2-core machine: compare arms within one latency",
        "latency_ms": table, "goal_at_500ms": goal(table),
        "in_flight": in_flight(data["corpus"], args.in_flight) if args.in_flight else {},
    }
    from tracerl.testbed.provenance import git_state

    result["git"] = git_state()  # the commit measured (issue 48)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
