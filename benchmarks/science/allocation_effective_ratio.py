"""Effective ratio of each rollout scheme at equal budget, and the success predictor's AUC.

Issue 5, Measure: on the embedded world with the tiny base model and no policy training, how
often does a scheme's batch hold prompts whose group mixes success and failure (the effective
ratio, spec section 1), at the same number of continuation rollouts per step? And how well does
the shared success predictor rank held-out prefixes as it sees more steps?

Setup: one SynthWiki world the tiny model never saw (its own world sizes and names from
``tiny_config.json``, fact seed 1; it was pretrained on fact seeds 1,000,000+), whose training
questions are cycled as the prompt pool (``--tasks`` of them, so prompts recur across steps as
in multi-epoch training), ``--pool`` prompts offered per step, ``--budget`` continuation
rollouts per step. Every scheme sees the same pools and the same seed.
Schemes: chain, dapo, tree_random, ``trace_uniform`` (trace without a predictor: both stages
spread evenly in pool and anchor order), ``trace`` (predictor on history features) and ``trace_ready`` (the
same plus the frozen reference's readiness l_k/V_k, as when TRACE credit is on), each once with
the scheme's default floor (a selected prompt gets at least ``group_size`` rollouts) and once
with the spec's floor of 2 (``_min2``: more, smaller groups), and once per
``--predictor-features`` input (``handcrafted``: no tag; ``_hidden``/``_both``: the policy's
hidden state at the node, alone or beside the 13 features). Each trace
variant trains its own predictor online on its own trees after each step (as in training).
Held-out AUC: chain rollouts on test-split questions (never trained on), scored after each
predictor update; ``anchors`` restricts to the boundaries stage 2 ranks.

Usage: ``python benchmarks/science/allocation_effective_ratio.py [--quick] [--seeds 5]``; writes
``benchmarks/results/allocation_effective_ratio.json``. ``--max-hops 2 --search-top-k 2`` gives
the training benchmarks' (and the demo's) setting. ``--ablation`` adds the allocation 2x2's
uniform arms with their own predictors (``trace_uu``: random anchors, unlike ``trace_uniform``;
``trace_ul``; ``trace_lu``), ``trace`` being learned + learned. ``--offline-prompts N`` (with
``--seeds 0``: alone) measures each predictor input's held-out AUC on more data (:func:`offline_auc`).

The hidden-state results in ``benchmarks/results/`` (``F = --predictor-features handcrafted hidden both``):
``--seeds 0 --pool 8 --offline-prompts 128 --heldout 48 --max-hops 2 --search-top-k 2 F`` ->
``..._hidden_offline_1to2hops.json``; ``--seeds 0 --pool 8 --offline-prompts 256 --heldout 96 F`` ->
``..._hidden_offline.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tracerl.agent.formats import get_format
from tracerl.allocation.features import success_leaves_below
from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor, weighted_auc
from tracerl.core.types import RolloutTree, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.models.scoring import ReferenceScorer
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.executor import LocalExecutor
from tracerl.testbed.provenance import provenance
from tracerl.allocation.schemes import SchemeConfig, expandable_nodes, get_scheme

OUT = Path(__file__).resolve().parents[1] / "results" / "allocation_effective_ratio.json"
BASELINES = ("chain", "dapo", "tree_random", "trace_uniform")


def scheme_names(args: argparse.Namespace) -> list[str]:
    """Baselines, then ``trace``/``trace_ready`` per ``--trace-min-per-prompt`` value (``_minM`` when set)."""
    return list(BASELINES) + predicted_names(args)


@dataclass(frozen=True)
class Variant:
    """A trace variant with its own online predictor."""

    floor: int
    """``trace_min_per_prompt`` (0: unset, i.e. group_size)."""
    features: str
    """``PredictorConfig.features``."""
    ready: bool
    """Also score readiness (the reference's l_k/V_k as predictor features)."""
    roots: str = "learned"
    prefixes: str = "learned"


def predicted_variants(args: argparse.Namespace) -> dict[str, Variant]:
    """The trace variants with their own online predictor, by name: ``trace_ready*`` also gets the
    reference's readiness; with ``--ablation``, ``trace_uu/ul/lu`` are the uniform arms of the
    allocation 2x2 (roots x prefixes) with the first floor and the first predictor input."""
    out = {}
    for m in args.trace_min_per_prompt:
        for feats in args.predictor_features:
            tag = ("" if feats == "handcrafted" else f"_{feats}") + (f"_min{m}" if m else "")
            out[f"trace{tag}"] = Variant(m, feats, False)
            if feats != "hidden":  # readiness is a handcrafted feature: a hidden-only predictor ignores it
                out[f"trace_ready{tag}"] = Variant(m, feats, True)
    if args.ablation:
        m, feats = args.trace_min_per_prompt[0], args.predictor_features[0]
        for roots, prefixes in (("uniform", "uniform"), ("uniform", "learned"), ("learned", "uniform")):
            out[f"trace_{roots[0]}{prefixes[0]}"] = Variant(m, feats, False, roots, prefixes)
    return out


def predicted_names(args: argparse.Namespace) -> list[str]:
    return list(predicted_variants(args))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 seeds x 3 steps, budget 32, pool 8 (a few minutes)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget", type=int, default=64, help="continuation rollouts per step")
    p.add_argument("--pool", type=int, default=16, help="prompts offered per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--trace-min-per-prompt", type=int, nargs="+", default=[0, 2],
                   help="SchemeConfig.trace_min_per_prompt values to run trace with (0: unset, i.e. group_size; "
                        "the spec's floor is 2)")
    p.add_argument("--predictor-features", nargs="+", default=["handcrafted"],
                   choices=["handcrafted", "hidden", "both"],
                   help="PredictorConfig.features values to run the trace variants with (hidden: the "
                        "policy's last-token hidden state at the node)")
    p.add_argument("--ablation", action="store_true",
                   help="also run the uniform arms of the allocation 2x2 (trace_uu, trace_ul, trace_lu)")
    p.add_argument("--offline-prompts", type=int, default=0,
                   help="also measure each predictor input's held-out AUC on chain rollouts of this many "
                        "training prompts (see offline_auc; 0: off)")
    p.add_argument("--max-hops", type=int, default=None, help="questions of at most this many hops (default: the world's)")
    p.add_argument("--search-top-k", type=int, default=3, help="search results per call")
    p.add_argument("--tasks", type=int, default=64, help="training prompts cycled through")
    p.add_argument("--heldout", type=int, default=24, help="held-out prompts for the predictor's AUC")
    p.add_argument("--preset", default="default", help="tiny model preset")
    p.add_argument("--fact-seed", type=int, default=1, help="world facts (unseen by the model)")
    p.add_argument("--model", default="", help="a model folder instead of the tiny model")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 1 is fastest for the tiny model (several threads on a busy "
                        "2-core machine made a step 6-60x slower)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.budget, args.pool = 2, 3, 32, 8
    return args


def _policy(args: argparse.Namespace) -> tuple[HFPolicy, str]:
    path = args.model
    if not path:
        from tracerl.testbed.tiny import load_or_pretrain
        from tracerl.testbed.tiny_config import get_preset

        path = str(load_or_pretrain(get_preset(args.preset)))
    return HFPolicy.from_pretrained(path, dtype=torch.float32), path


def _world_config(model_dir: str, fact_seed: int, max_hops: int | None) -> WorldConfig:
    """The tiny model's own world sizes and names (``tiny_config.json``) with an unseen fact seed."""
    hops = {} if max_hops is None else {"max_hops": max_hops}
    cfg_path = Path(model_dir) / "tiny_config.json"
    if not cfg_path.exists():
        return WorldConfig(fact_seed=fact_seed, **hops)
    tiny = json.loads(cfg_path.read_text())
    seen = range(tiny["first_fact_seed"], tiny["first_fact_seed"] + tiny["num_worlds"])
    if fact_seed in seen:
        raise ValueError(f"fact seed {fact_seed} is one of the model's pretraining worlds {seen}")
    return replace(WorldConfig(**tiny["world"]), fact_seed=fact_seed, **hops)


def _engine(policy: HFPolicy, world_cfg: WorldConfig, top_k: int) -> tuple[RolloutEngine, list[Task], list[Task]]:
    world = build_world(world_cfg)
    cfg = EngineConfig()
    tools = search_tools(SearchIndex(world.documents), top_k=top_k, max_tokens=cfg.max_observation_tokens)
    env = ToolEnvironment(tools, EnvConfig(max_turns=cfg.max_turns, max_observation_tokens=cfg.max_observation_tokens))
    return RolloutEngine(policy, env, get_format("react"), exact_match, cfg), world.train, world.test


def heldout_auc(pred: SuccessPredictor, trees: list[RolloutTree], which: str = "all") -> float:
    """AUC of the predictor's node values against the outcomes of the leaves below each node, over
    ``all`` nodes, the ``anchors`` stage 2 ranks, or the ``roots`` (stage 1: unseen prompts)."""
    picked, ids, wins, losses = [], [], [], []
    for tree in trees:
        tree.backup()
        w, f = success_leaves_below(tree)
        nodes = {"all": [n.id for n in tree.nodes], "anchors": expandable_nodes(tree), "roots": [0]}[which]
        for nid in nodes:
            if w[nid] + f[nid]:
                picked.append(tree)
                ids.append(nid)
                wins.append(w[nid])
                losses.append(f[nid])
    return weighted_auc(pred.predict_nodes(picked, ids), wins, losses) if ids else float("nan")


def _scheme(name: str, args: argparse.Namespace, preds: dict[str, SuccessPredictor], scorer: ReferenceScorer) -> Any:
    cfg = SchemeConfig(group_size=args.group_size)
    if name == "trace_uniform":  # the uniform+uniform ablation: trace without a predictor
        return get_scheme("trace", cfg)
    if name not in preds:
        return get_scheme(name, cfg)
    v = predicted_variants(args)[name]
    cfg = SchemeConfig(group_size=args.group_size, trace_min_per_prompt=v.floor or None, trace_roots=v.roots,
                       trace_prefixes=v.prefixes)
    return get_scheme("trace", cfg, predictor=preds[name], score=v.ready)


def _score_all(trees: list[RolloutTree], tasks: dict[str, Task], scorer: ReferenceScorer) -> None:
    scorer.score(trees, tasks)


def run_seed(seed: int, args: argparse.Namespace, engine: RolloutEngine, train: list[Task], test: list[Task]) -> dict:
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(train), generator=g)[: args.tasks].tolist()
    tasks = [train[i] for i in order]
    scorer = ReferenceScorer(engine.backend.model, engine.tokenizer, engine.fmt)
    held = test[: args.heldout]
    plain = engine.rollout(held, [4] * len(held), generator=g)[0]
    scored = copy.deepcopy(plain)
    _score_all(scored, {t.id: t for t in held}, scorer)
    names, variants = scheme_names(args), predicted_variants(args)
    heldout = {name: scored if v.ready else plain for name, v in variants.items()}
    preds = {name: SuccessPredictor(PredictorConfig(features=v.features)) for name, v in variants.items()}
    out: dict[str, Any] = {name: [] for name in names}
    out["predictor"] = {name: [] for name in variants}
    for step in range(args.steps):
        start = (step * args.pool) % len(tasks)
        pool = (tasks + tasks)[start : start + args.pool]
        for name in names:
            clock = time.perf_counter()
            gen = torch.Generator().manual_seed(seed * 1000 + step)
            executor = LocalExecutor(engine, scorer.score_nodes)  # readiness-aware variants score through it
            res = _scheme(name, args, preds, scorer).collect(executor, pool, args.budget, gen)
            row = {"effective_ratio": res.effective_ratio, "rollouts": res.cost.rollouts,
                   "generated_tokens": res.cost.generated_tokens, "seconds": time.perf_counter() - clock, **res.info}
            if name in preds:
                fresh = preds[name].update(res.trees)
                out["predictor"][name].append({k: _finite(v) for k, v in {
                    "fresh_auc": fresh["auc"], "fresh_brier": fresh["brier"],
                    "heldout_auc": heldout_auc(preds[name], heldout[name], "all"),
                    "heldout_auc_anchors": heldout_auc(preds[name], heldout[name], "anchors"),
                }.items()})
            engine.forget(res.trees)
            out[name].append(row)
        print(f"seed {seed} step {step}: " + " ".join(f"{n}={out[n][-1]['effective_ratio']:.2f}" for n in names)
              + " heldout_auc " + " ".join(f"{n}={out['predictor'][n][-1]['heldout_auc']}" for n in variants),
              flush=True)
    return out


def _finite(x: float) -> float | None:
    return None if x != x else x  # NaN is not JSON


def _mean(xs: list[float | None]) -> float | None:
    """Mean without NaN/None entries (one-class AUCs); None when nothing is left (valid JSON)."""
    kept = [x for x in xs if x is not None and x == x]
    return round(statistics.fmean(kept), 4) if kept else None


def summarise(runs: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    schemes = {}
    for name in scheme_names(args):
        per_seed = [_mean([r["effective_ratio"] for r in run[name]]) for run in runs]
        rows = [r for run in runs for r in run[name]]
        schemes[name] = {
            "effective_ratio": _mean(per_seed),
            "effective_ratio_per_seed": per_seed,
            "effective_ratio_after_step1": _mean([r["effective_ratio"] for run in runs for r in run[name][1:]]),
            "effective_ratio_per_step": [
                _mean([run[name][s]["effective_ratio"] for run in runs]) for s in range(args.steps)
            ],
            "mixed_prompts_per_step": _mean([r["mixed_prompts"] for r in rows]),
            "prompts_per_step": _mean([r["prompts"] for r in rows]),
            "success_rate": _mean([r["success_rate"] for r in rows]),
            "rollouts_per_step": _mean([r["rollouts"] for r in rows]),
            "generated_tokens_per_step": _mean([r["generated_tokens"] for r in rows]),
            "seconds_per_step": _mean([r["seconds"] for r in rows]),
            "prompt_state_seconds_per_step": _mean([r.get("prompt_state_seconds") for r in rows]),
        }
    chain = schemes["chain"]["effective_ratio"]
    ratios = {n: round(s["effective_ratio"] / chain, 3) if chain and s["effective_ratio"] is not None else None
              for n, s in schemes.items()}
    pred = {
        name: {
            key: [_mean([run["predictor"][name][s][key] for run in runs]) for s in range(args.steps)]
            for key in ("fresh_auc", "fresh_brier", "heldout_auc", "heldout_auc_anchors")
        }
        for name in predicted_names(args)
    }
    return {
        "schemes": schemes,
        "ratio_vs_chain": ratios,
        "predictor_per_step": pred,
    }


def offline_auc(args: argparse.Namespace, engine: RolloutEngine, train: list[Task], test: list[Task]) -> dict:
    """Held-out AUC per predictor input on more data than a quick run's few successes.

    Chain rollouts (groups of ``--group-size``) of ``--offline-prompts`` distinct training prompts
    feed each predictor in steps of ``--pool`` prompts, as the trainer does; after every update
    the predictor ranks all nodes, the anchors and the roots (stage 1's unseen prompts) of chain
    rollouts on ``--heldout`` test prompts. Every input sees the same trees: a paired comparison.
    """
    g = torch.Generator().manual_seed(12345)
    prompts = [train[i] for i in torch.randperm(len(train), generator=g)[: args.offline_prompts].tolist()]
    held = test[: args.heldout]
    held_trees = engine.rollout(held, [args.group_size] * len(held), generator=g)[0]
    steps = []
    for start in range(0, len(prompts), args.pool):
        part = prompts[start : start + args.pool]
        steps.append(engine.rollout(part, [args.group_size] * len(part), generator=g)[0])
        engine.forget(steps[-1])
    engine.forget(held_trees)
    leaves = [t.reward for tree in held_trees for t in tree.trajectories.values() if not t.infra_failed]
    out: dict[str, Any] = {"heldout_leaves": len(leaves), "heldout_successes": sum(r > 0.5 for r in leaves),
                           "train_successes": sum(t.reward > 0.5 for s in steps for tree in s
                                                  for t in tree.trajectories.values())}
    for feats in args.predictor_features:
        pred = SuccessPredictor(PredictorConfig(features=feats))
        rows = []
        for trees in steps:
            pred.update(trees)
            rows.append({key: _finite(heldout_auc(pred, held_trees, which)) for key, which in (
                ("heldout_auc", "all"), ("heldout_auc_anchors", "anchors"), ("heldout_auc_roots", "roots"))})
        out[feats] = {key: [row[key] for row in rows] for key in rows[0]}
        print(f"offline {feats}: " + " ".join(f"{k}={v[-1]}" for k, v in out[feats].items()), flush=True)
    return out


def main() -> None:
    args = _args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policy, path = _policy(args)
    # Hidden states are read off the prefill forward that runs anyway; recording them changes no sample.
    policy.record_states = any(f != "handcrafted" for f in args.predictor_features)
    world_cfg = _world_config(path, args.fact_seed, args.max_hops)
    engine, train, test = _engine(policy, world_cfg, args.search_top_k)
    offline = offline_auc(args, engine, train, test) if args.offline_prompts else None
    runs: list[dict] = []
    result = _write(args, path, world_cfg, runs, offline, t0)  # --seeds 0: the offline AUCs alone
    for seed in range(args.seeds):  # the JSON is rewritten after every seed: a killed run keeps its data
        runs.append(run_seed(seed, args, engine, train, test))
        result = _write(args, path, world_cfg, runs, offline, t0)
    print(json.dumps({k: result.get(k) for k in ("ratio_vs_chain", "predictor_per_step", "offline_predictor",
                                                  "seconds")}, indent=2))


def _write(args: argparse.Namespace, path: str, world_cfg: WorldConfig, runs: list[dict], offline: dict | None,
           t0: float) -> dict[str, Any]:
    result = {
        "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seeds_done": len(runs),
        "model": path,
        "provenance": provenance(path if args.model else "tiny", args.preset),
        "world": asdict(world_cfg),
        **(summarise(runs, args) if runs else {}),
        **({"offline_predictor": offline} if offline is not None else {}),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
