"""Search latency and index build time on a 100k-document SynthWiki corpus (issue 3, Measure).

Usage: python benchmarks/systems/search_latency.py [--docs 100000] [--queries 1000]
Writes benchmarks/results/search_latency.json. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world

SHARES = {"num_people": 0.35, "num_cities": 0.18, "num_countries": 0.02, "num_books": 0.18,
          "num_bands": 0.12, "num_companies": 0.15}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "search_latency.json")
    args = parser.parse_args()

    start = time.perf_counter()
    sizes = {k: int(v * args.docs) for k, v in SHARES.items()}
    world = build_world(WorldConfig(num_train=args.queries, num_test=0, **sizes))
    generate_s = time.perf_counter() - start
    docs = world.documents

    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        index = SearchIndex(docs, cache_dir=cache)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        cached = SearchIndex(docs, cache_dir=cache)
        load_s = time.perf_counter() - start
        assert cached.loaded_from_cache

    rng = random.Random(0)
    title_queries = [d.title for d in rng.sample(docs, args.queries)]
    question_queries = [t.question for t in world.train]
    tools = search_tools(index, top_k=3)
    results = {}
    for label, queries in (("title", title_queries), ("question", question_queries)):
        latencies = []
        for query in queries:
            t0 = time.perf_counter()
            tools.call("search", {"query": query})
            latencies.append((time.perf_counter() - t0) * 1000)
        results[label] = {"queries": len(queries), "mean_ms": statistics.fmean(latencies),
                          "p50_ms": percentile(latencies, 0.5), "p95_ms": percentile(latencies, 0.95)}
    hits = sum(index.search(q, 1)[0].title == q for q in title_queries)

    report = {
        "documents": len(docs),
        "words_per_document": statistics.fmean(len(d.text.split()) for d in docs),
        "world_generation_s": generate_s,
        "index_build_s": build_s,
        "index_cache_load_s": load_s,
        "search_tool_latency_top3": results,
        "title_query_top1_accuracy": hits / len(title_queries),
        "machine": f"{platform.processor() or platform.machine()}, python {platform.python_version()}",
    }
    from tracerl.testbed.provenance import provenance  # imported after the timings: it loads torch

    report["provenance"] = provenance(None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
