"""How often the pretraining explorer itself answers correctly, per hop count (issue 13 item 1).

The tiny base models imitate a scripted, question-agnostic explorer (tracerl/testbed/tiny_data.py),
so the explorer's own success rate bounds what the base model can do by imitation. This runs each
preset's explorer on the benchmark's questions (1-3 hops, 3 search results per call, 6 turns) of
worlds outside every preset's pretraining range and records exact match per hop count. No model is
involved: a few seconds of CPU.

    python benchmarks/science/explorer_success.py
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, write_json

from tracerl.agent.formats import get_format
from tracerl.core.types import Action
from tracerl.envs.verifiers import exact_match
from tracerl.testbed.tiny_config import get_preset
from tracerl.testbed.tiny_data import WorldTools, explore, pretraining_worlds


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["bench", "bench_guided", "bench_hops"])
    p.add_argument("--worlds", type=int, default=3)
    p.add_argument("--questions", type=int, default=300, help="Questions per world.")
    p.add_argument("--out", type=Path, default=RESULTS / "explorer_success.json")
    return p.parse_args()


def final_answer(pieces: list[tuple[str, bool]], fmt: Any, tools: Any) -> str | None:
    """The answer of an episode's last assistant piece, or None when it ended without one."""
    text, is_assistant = pieces[-1]
    if not is_assistant:
        return None
    action: Action = fmt.parse(text, tools)
    return action.answer if action.kind == "answer" else None


def explorer_success(preset: str, worlds: int, questions: int, max_turns: int = 6) -> dict[str, float]:
    """Exact match per hop count (``{"1": .., "2": .., "3": ..}``) of ``preset``'s explorer."""
    config = get_preset(preset)
    fmt = get_format("react")
    world = replace(config.world, min_hops=1, max_hops=3)
    explorer = replace(config.explorer, top_k=3)
    rng = random.Random(f"explorer-success:{preset}")
    hits, total = Counter(), Counter()
    seeds = range(5_000, 5_000 + worlds)  # outside every preset's pretraining fact seeds
    for built in pretraining_worlds(world, seeds, questions):
        tools = WorldTools(built, explorer, max_turns)
        for task in built.train:
            answer = final_answer(explore(task, tools, fmt, rng, explorer), fmt, tools.tools)
            total[task.hops] += 1
            hits[task.hops] += exact_match(answer, task) if answer is not None else 0.0
    return {str(h): hits[h] / total[h] for h in sorted(total)}


def main() -> None:
    args = _args()
    rows = {}
    for preset in args.presets:
        explorer = get_preset(preset).explorer
        rows[preset] = {"explorer": {"guided": explorer.guided, "hop_aware": explorer.hop_aware,
                                     "search_count_weights": list(explorer.search_count_weights)},
                        "success_by_hops": explorer_success(preset, args.worlds, args.questions)}
        print(preset, rows[preset]["success_by_hops"], flush=True)
    write_json(args.out, {"worlds": args.worlds, "questions_per_world": args.questions, "presets": rows})


if __name__ == "__main__":
    main()
