"""Quick measurements behind docs/TRACE.md section 6 ("Deviations from the papers").

Issue 13 item 7. Everything runs on the embedded tiny model's *base* weights (no training) in the
sample-efficiency setting (1-2 hop questions, two search results per call, the default engine
limits) on questions of an unseen world (``data.eval_fact_seed``), so each number says how much a
deviation touches what the policy actually does before RL:

- ``turn_end``: the react turn ending at its action's ``]`` against the old rule (only
  ``Observation:`` or the token cap), same seeds, 32 questions x 8 samples: accuracy, generated
  tokens per trajectory, turns at the cap, trajectories with identical token ids (an answer's
  EOS set aside); the other measurements reuse the new rule's trajectories;
- ``transitions``: share of transitions that are invalid actions (counted as transitions);
- ``gigpo_states``: share of turns (after the first) whose anchor state another trajectory of the
  group shares, state = full observation history (tracerl) vs the current observation only;
- ``distinct_observations``: the predictor's distinct-observation count vs distinct documents;
- ``trace_steps``: per step of TRACE allocation (predictor trained online, policy fixed): whether
  stage 1 fell back to uniform (cold predictor) and how much budget went to the root top-up;
- ``dapo``: from the committed ``sample_efficiency_demo.json`` (the demo-setting sweep), the share of dapo steps that kept no
  group (no refill) and GRPO's mixed groups per step.

    python benchmarks/science/deviations.py          # about 2 min on one core

(Run it from the checkout whose code it should measure, e.g. ``PYTHONPATH=$PWD`` in a worktree:
the script's folder, not the working directory, heads ``sys.path``.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, configure_torch, machine, provenance_of, write_json

from tracerl.agent.formats import ReactFormat, get_format
from tracerl.allocation.predictor import SuccessPredictor
from tracerl.allocation.trace_scheme import TraceScheme
from tracerl.core.types import Trajectory
from tracerl.envs.search import search_environment
from tracerl.envs.synthwiki import build_world
from tracerl.envs.verifiers import exact_match
from tracerl.testbed.tiny_config import DEFAULT_WORLD
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.evaluate import load_policy
from tracerl.rollout.executor import LocalExecutor
from tracerl.allocation.schemes import SchemeConfig
from tracerl.config.schema import DataConfig


class UntilObservation(ReactFormat):
    """The react format before issue 13: a turn ended only at ``Observation:`` (or the cap)."""

    stop_strings = ("Observation:",)

    def ends_turn(self, text: str) -> bool:
        return True

    def observation_ids(self, obs: Any, sampled_ids: Any, tokenizer: Any) -> list[int]:
        return list(tokenizer.encode(self.render_observation(obs), add_special_tokens=False))


def _rollouts(engine: RolloutEngine, tasks: list, n: int, seed: int) -> dict[tuple[str, int], Trajectory]:
    trees, _ = engine.rollout(tasks, [n] * len(tasks), tree_ids=[t.id for t in tasks], seed=seed)
    engine.forget(trees)
    # keyed by the first turn's node: the first round adds the chains in the same order in any run
    return {(tr.group_id, tr.node_path[1]): tr for t in trees for tr in t.trajectories.values()}


def _summary(trajs: dict[tuple[str, int], Trajectory], cap: int) -> dict[str, float]:
    turns = [turn for tr in trajs.values() for turn in tr.turns]
    return {"accuracy": sum(t.reward for t in trajs.values()) / len(trajs),
            "generated_tokens_per_trajectory": sum(t.generated_tokens for t in trajs.values()) / len(trajs),
            "turns_per_trajectory": len(turns) / len(trajs),
            "turns_at_cap": float(sum(len(t.assistant_ids) >= cap for t in turns))}


def turn_end(policy: Any, env: Any, cfg: EngineConfig, tasks: list, n: int) -> tuple[dict[str, Any], dict]:
    """Old vs new react turn end, same seeds; returns the summary and the new run's trajectories."""
    runs = {name: _rollouts(RolloutEngine(policy, env, fmt, exact_match, cfg), tasks, n, seed=5)
            for name, fmt in (("until_observation", UntilObservation()), ("action_bracket", get_format("react")))}
    eos = policy.tokenizer.eos_token_id
    old, new = runs["until_observation"], runs["action_bracket"]
    same = sum((o.token_ids[:-1] if o.token_ids[-1] == eos else o.token_ids) == new[k].token_ids
               for k, o in old.items())
    out: dict[str, Any] = {name: _summary(trajs, cfg.max_turn_tokens) for name, trajs in runs.items()}
    out["identical_trajectories"] = same / len(old)
    return out, new


def transitions(trajs: list[Trajectory]) -> dict[str, float]:
    trans = [turn for tr in trajs for turn in tr.turns if turn.is_transition]
    failed = [any(t.is_transition and (t.action.kind == "invalid" or t.tool_error) for t in tr.turns) for tr in trajs]
    return {"transitions": float(len(trans)),
            "invalid_action_share": sum(t.action.kind == "invalid" for t in trans) / len(trans),
            "rejected_tool_call_share": sum(t.action.kind == "tool" and t.tool_error for t in trans) / len(trans),
            "trajectories_with_one": sum(failed) / len(trajs)}


def gigpo_states(trajs: list[Trajectory]) -> dict[str, float]:
    """Share of turns after the first whose state (group + key) another turn of the group shares
    (the first turn's state is the prompt, shared by the whole group under either key)."""
    def shared(key_of: Any) -> float:
        keys = [(tr.group_id, key_of(tr, t)) for tr in trajs for t in range(1, len(tr.turns))]
        counts = Counter(keys)
        return sum(counts[k] > 1 for k in keys) / len(keys)

    return {"turns_after_the_first": float(sum(max(len(tr.turns) - 1, 0) for tr in trajs)),
            "observation_history": shared(lambda tr, t: tuple(tuple(x.observation_ids) for x in tr.turns[:t])),
            "current_observation": shared(lambda tr, t: tuple(tr.turns[t - 1].observation_ids))}


def distinct_observations(trajs: list[Trajectory]) -> dict[str, float]:
    """Per prefix (after each turn): distinct successful observation strings vs document titles."""
    rows = []
    for tr in trajs:
        seen, docs, doc_sum = set(), set(), 0
        for turn in tr.turns:
            if turn.is_transition and not (turn.tool_error or turn.action.kind == "invalid") and turn.observation:
                titles = {line.split(":", 1)[0] for line in turn.observation.split("\n") if ":" in line}
                doc_sum += len(titles) if turn.observation not in seen else 0
                seen.add(turn.observation)
                docs |= titles
            rows.append((len(seen), len(docs), doc_sum > len(docs)))
    n = len(rows)
    return {"prefixes": float(n), "observations_mean": sum(r[0] for r in rows) / n,
            "documents_mean": sum(r[1] for r in rows) / n,
            "share_where_a_document_repeats": sum(r[2] for r in rows) / n}


def trace_steps(engine: RolloutEngine, pool: list, steps: int) -> list[dict[str, float]]:
    predictor = SuccessPredictor()
    scheme = TraceScheme(SchemeConfig(group_size=8), predictor)
    out = []
    for step in range(steps):
        cold = not predictor.is_trained
        res = scheme.collect(LocalExecutor(engine), pool[16 * step: 16 * step + 16], 64, seed=100 + step)
        out.append({"step": float(step), "cold_predictor": float(cold), "effective_ratio": res.effective_ratio,
                    **{k: res.info[k] for k in ("stage1_prompts", "stage1_rollouts", "anchors",
                                                "stage2_rollouts", "root_topup")}})
        predictor.update(res.trees)
        engine.forget(res.trees)
    return out


def dapo_from_sweep() -> dict[str, float]:
    data = json.loads((RESULTS / "sample_efficiency_demo.json").read_text())
    dapo = [e for run in data["runs"]["dapo"] for e in run["effective_ratio"]]
    grpo = [e for run in data["runs"]["grpo"] for e in run["effective_ratio"]]
    group = data["setting"]["group_size"]
    return {"steps": float(len(dapo)), "steps_without_a_kept_group": sum(e == 0 for e in dapo) / len(dapo),
            "grpo_mixed_groups_per_step": group * sum(grpo) / len(grpo),
            "groups_sampled_per_step": data["setting"]["budget"] / group}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=32, help="Questions of the turn-end comparison.")
    p.add_argument("--samples", type=int, default=8, help="Samples per question (the sweep's group size).")
    p.add_argument("--trace-steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "deviations.json"))
    args = p.parse_args()
    configure_torch(args.threads)
    start = time.time()
    policy = load_policy("tiny")
    world = build_world(replace(DEFAULT_WORLD, max_hops=2, fact_seed=DataConfig.eval_fact_seed,
                                num_train=args.prompts + 16 * args.trace_steps, num_test=0))
    cfg = EngineConfig()
    env = search_environment(world.documents, 2, cfg)
    ends, trajs = turn_end(policy, env, cfg, world.train[: args.prompts], args.samples)
    sample = list(trajs.values())
    engine = RolloutEngine(policy, env, get_format("react"), exact_match, cfg)
    data = {
        "setting": {"model": "tiny (default preset, base weights)", "world": "default, 1-2 hops, unseen facts",
                    "search_top_k": 2, "engine": asdict(cfg),
                    "prompts": args.prompts, "samples": args.samples},
        "turn_end": ends, "transitions": transitions(sample), "gigpo_states": gigpo_states(sample),
        "distinct_observations": distinct_observations(sample),
        "trace_steps": trace_steps(engine, world.train[args.prompts:], args.trace_steps),
        "dapo": dapo_from_sweep(), "seconds": time.time() - start, **machine(),
        "provenance": provenance_of(tiny_preset="default"),
    }
    print(json.dumps(data, indent=1))
    write_json(Path(args.out), data)


if __name__ == "__main__":
    main()
