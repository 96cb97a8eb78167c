"""Shared helpers of the training benchmarks (sample_efficiency, step_overhead, tree_savings, vs_trl).

Every benchmark builds its runs from the same :func:`tracerl.config.schema.resolve_config` call as
``tracerl train`` (preset, optional ``--smoke`` overlay, ``--set a.b=value`` overrides), so a
benchmark setting is reproducible with the CLI. Run as a script, this module prints the Markdown
tables of the committed result files (what the docs' results pages show), or refreshes them in place:

    python benchmarks/common.py
    python benchmarks/common.py --splice docs/results/*.md   # --check: exit 1 when one is stale or missing
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from protocol import factorial_table, protocol_table
from tables import fmt, lr_controls_table, pm, table, title

RESULTS = Path(__file__).resolve().parent / "results"

LEARNABLE_SETTING: list[str] = [
    "data.world.max_hops=2",  # one- and two-hop questions, as in the demo
    "data.search_top_k=2",
    "optim.lr=1e-3",
]
"""The default setting of the training benchmarks: the demo's. It is already hard for the embedded
0.99M-parameter model: greedy base accuracy 0%, about 2% of sampled rollouts succeed, and what it
can learn here (one-hop questions, about 24% of the unseen world) takes GRPO 40-50 steps of 64
rollouts to find at lr 3e-4. Harder settings give it almost no mixed groups (:data:`HARD_SETTING`)."""

HARD_SETTING: list[str] = [
    "data.world.min_hops=1",
    "data.world.max_hops=4",  # up to 4-hop questions (the prototype that saturated in ~200 steps had 1-3)
    "rollout.engine.max_turns=6",  # a 4-hop question needs 5 turns: one turn of slack instead of three
]
"""``--hard`` (on top of the learnable setting): 1-4 hop questions with one turn of slack, on top of the default world's look-alike
distractor names. Not the default: the embedded base model solves 1-3% of its rollouts and none
beyond one hop, so most groups stay all-fail. ``data.world.min_hops=2``
left the base model at 0 of 240 held-out episodes (nothing to learn from); more distractors or
larger worlds add names the embedded model's word-level vocabulary does not hold (<unk>)."""

DEV_MODEL: list[str] = ["model.name_or_path=tiny", "model.tiny_preset=smoke"]
"""With ``--smoke``: the quickly pretrained smoke tiny model instead of a random one (it knows the
smoke world's names and the react format a little), for development runs."""


BENCH_SETTING: list[str] = [
    "model.tiny_preset=bench_hops",  # 200 worlds without look-alike names, hop-aware explorer (tiny_config.py)
    "data.world.distractors=0",  # the names the bench model knows
    "data.world.max_hops=3",
    "data.search_top_k=3",
    "rollout.engine.max_turns=6",  # a 3-hop question needs 4 turns
    "rollout.engine.max_turn_tokens=32",  # a turn is ~9 tokens; caps the cost of run-on turns
    "optim.lr=1e-3",
]
"""The sample-efficiency testbed (issue 13): 1-3 hop questions on a world without look-alike
distractor names, three search results per call, the ``bench_hops`` tiny model (whose base model
knows how many searches a question needs, not which). Chosen by the lever measurements in
docs/results/setting.md ("Choosing the setting", ``results/testbed_levers.json``)."""


CREDIT_SETTING: list[str] = BENCH_SETTING + [
    "data.world.min_hops=2",  # two- and three-hop questions only: most GRPO groups all-fail
    "rollout.engine.max_turns=8",  # room for a wrong search and a retry
]
"""The credit testbed: where turn credit should matter (long episodes, sparse outcomes)."""

LOOKALIKE_SETTING: list[str] = [s for s in CREDIT_SETTING if not s.startswith(("model.tiny_preset", "data.world.distractors"))] + [
    "model.tiny_preset=bench_hops_lookalike",  # pretrained on the world with look-alike names
    "data.world.distractors=1",  # one look-alike per name: a wrong search returns a document without the gold
]
"""The credit testbed with look-alike distractor names (a search for the look-alike finds a
document of the same shape without the gold), on a base model pretrained on that vocabulary."""

LONG_SETTING: list[str] = [s for s in LOOKALIKE_SETTING if not s.startswith(
    ("model.tiny_preset", "data.world.min_hops", "data.world.max_hops", "rollout.engine.max_turns"))] + [
    "model.tiny_preset=bench_hops_clues_longer",  # shipped, pinned: pretrained on the clue world, 6,300 steps
    "data.world.clues=1",  # each document ends by naming its two-hop entities
    "data.world.min_hops=4",
    "data.world.max_hops=5",  # four- and five-hop questions: four or five searches when solved
    "rollout.engine.max_turns=10",  # five searches and an answer need 6 turns: four turns of slack
    "rollout.engine.temperature=0.4",  # sampled success 5.0% at the base (1.0: under 1%)
]
"""The long-horizon testbed: the look-alike world with clue sentences, four- and five-hop questions,
chosen by the pilot's fifth round (``science/long_horizon_pilot.py``, variant ``cluesL_h45_t10_temp04``:
the look-alike setting's other knobs, then the variant's; ``long_horizon_pilot_round5.json``)."""


def add_config_args(parser: argparse.ArgumentParser, *, hard: bool = True) -> None:
    """``--set``, ``--smoke``, ``--dev-model``, ``--hard``, ``--threads``, ``--work-dir``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=VALUE",
                        help="Config override as for `tracerl train --set` (repeatable; applied last).")
    parser.add_argument("--smoke", action="store_true",
                        help="Apply the --smoke-random overlay (random tiny model, tiny world, no hard setting): a pipeline check.")
    parser.add_argument("--dev-model", action="store_true",
                        help="With --smoke: use the pretrained smoke tiny model (" + " ".join(DEV_MODEL) + ").")
    if hard:
        parser.add_argument("--hard", action="store_true",
                            help="The harder setting instead of the demo's (" + " ".join(HARD_SETTING) + ").")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave torch's default).")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/tracerl-bench"),
                        help="Scratch folder for run folders (deleted and recreated per run).")


def setting_overrides(args: argparse.Namespace, base: list[str], tail: tuple[str, ...] = (),
                      setting: list[str] | None = None) -> list[str]:
    """The overrides a benchmark applies: its base knobs, the setting (default the demo's
    :data:`LEARNABLE_SETTING`, plus :data:`HARD_SETTING` with ``--hard``), its ``tail``, the dev
    model, then --set."""
    out = list(base)
    if not args.smoke:  # the smoke world stays as --smoke defines it
        chosen = LEARNABLE_SETTING if setting is None else setting
        out += chosen + (HARD_SETTING if getattr(args, "hard", False) else [])
    out += list(tail)
    if args.smoke and args.dev_model:
        out += DEV_MODEL
    return out + list(args.overrides)


def configure_torch(threads: int) -> None:
    """torch intra-op threads for this process and the trainers it builds.

    The trainer applies ``model.threads`` (0: ``$TRACERL_THREADS`` or all available cores) when it
    is built, so the count is also exported as ``TRACERL_THREADS``: without it every run took
    both cores and its threads spun against the other processes (steps 10-50x slower on a
    loaded 2-core machine)."""
    import os

    import torch

    if threads:
        os.environ["TRACERL_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def resolve(preset: str, overrides: list[str], smoke: bool) -> Any:
    from tracerl.config.schema import resolve_config

    return resolve_config(preset, overrides=overrides, smoke="random" if smoke else False)


def fresh_dir(path: Path) -> Path:
    """An empty folder (a run folder that already exists would resume or append metrics)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def mean(xs: list[float | None]) -> float | None:
    """Mean of the finite entries; None when there is none (valid JSON)."""
    kept = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return statistics.fmean(kept) if kept else None


def std(xs: list[float | None]) -> float | None:
    """Sample standard deviation of the finite entries; None with fewer than two."""
    kept = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return statistics.stdev(kept) if len(kept) > 1 else None


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rounded(value: Any, digits: int = 4) -> Any:
    """Round floats inside nested data (keeps the JSON readable and diffs small)."""
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def machine() -> dict[str, Any]:
    import torch

    return {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": _cpus()}


def provenance_of(config: Any = None, *, name_or_path: str | None = "tiny", tiny_preset: str = "default") -> dict[str, Any]:
    """The base model (preset, config hash, sha256 of the shipped weights) and the machine (torch, CPU
    model, cores, threads, platform) for a results JSON: :func:`tracerl.testbed.provenance.provenance`
    of ``config``'s model when a resolved config is given, else of ``name_or_path`` / ``tiny_preset``
    (``None``: no pretrained base model, machine facts only)."""
    from tracerl.testbed.provenance import provenance

    if config is not None:
        name_or_path, tiny_preset = config.model.name_or_path, config.model.tiny_preset
    return provenance(name_or_path, tiny_preset)


def questions_per_hop(setting: dict[str, Any]) -> dict[str, dict[str, int]]:
    """How many held-out questions of each hop count the endpoints draw, from a sample-efficiency
    ``setting`` (its overrides, ``sampled_questions``, ``final_eval_questions``): ``{"sampled":
    {"2": 151, "3": 149}, "greedy": {...}}``. Both take the first questions of the unseen world's test
    split, which is shuffled, so the hop counts are near, not exactly, equal; the split does not
    depend on the run seed, so every run of a setting shares these counts."""
    from collections import Counter

    from tracerl.train.data import load_task_data

    config = resolve("grpo", setting["overrides"], bool(setting.get("smoke")))
    held_out = load_task_data(config.data, config.rollout.engine, config.seed).held_out

    def count(size: int) -> dict[str, int]:
        return {str(h): n for h, n in sorted(Counter(t.hops for t in held_out[:size]).items())}

    return {"sampled": count(setting.get("sampled_questions") or 0), "greedy": count(setting["final_eval_questions"])}


def recorded(shard: dict[str, Any], section: str, key: str) -> Any:
    """``shard["provenance"][section][key]``, or None where the shard did not record it."""
    return ((shard.get("provenance") or {}).get(section) or {}).get(key)


def check_one_base_model(paths: list[Path], shards: list[dict[str, Any]]) -> None:
    """Refuse (``SystemExit`` naming the file) merging shards that started from different base models
    (the ``provenance`` sha256; a shard without one differs from a shard with one)."""
    def sha(shard: dict[str, Any]) -> Any:
        return recorded(shard, "base_model", "sha256")

    for path, shard in zip(paths[1:], shards[1:], strict=True):
        if sha(shard) != sha(shards[0]):
            raise SystemExit(f"{path}: base model sha256 {sha(shard)} differs from {paths[0]}'s ({sha(shards[0])}); "
                             "merge shards of one base model")


def check_one_cpu_per_seed(paths: list[Path], shards: list[dict[str, Any]]) -> dict[Any, Any]:
    """Refuse (``SystemExit`` naming both files) merging shards in which one seed's runs come from
    different CPU types (the ``provenance`` machine's ``cpu``; a shard without one differs from a shard
    with one): training on one base and seed diverges across CPU types, so a paired difference between
    them would carry the machine as well as the arm. Returns each seed's CPU type."""
    first: dict[Any, tuple[Path, Any]] = {}
    for path, shard in zip(paths, shards, strict=True):
        cpu = recorded(shard, "machine", "cpu")
        for seed in sorted({r["seed"] for rs in shard["runs"].values() for r in rs}):
            other, other_cpu = first.setdefault(seed, (path, cpu))
            if other_cpu != cpu:
                raise SystemExit(f"{path}: seed {seed} ran on {cpu}, in {other} on {other_cpu}; "
                                 "merge runs of one seed made on one CPU type")
    return {seed: cpu for seed, (_, cpu) in first.items()}


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def save_figure(fig: Any, out: Path) -> Path:
    """Lay out, write and close a matplotlib figure (each benchmark's PNG)."""
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write a results file; one without a ``git`` entry gets the commit it was made from and whether
    the tree was dirty (:func:`tracerl.testbed.provenance.git_state`; ``None`` with a note outside a checkout)."""
    from tracerl.testbed.provenance import git_state

    data = data if "git" in data else {**data, "git": git_state()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rounded(data), indent=2) + "\n")
    return path


def describe_config(config: Any) -> dict[str, Any]:
    """The knobs that define a benchmark setting (world, limits, budget, model)."""
    from dataclasses import asdict

    world = asdict(config.data.world)
    engine = asdict(config.rollout.engine)
    return {
        "model": config.model.name_or_path, "tiny_preset": config.model.tiny_preset,
        "world": {k: world[k] for k in ("min_hops", "max_hops", "distractors", "num_people", "num_train", "num_test")},
        "train_worlds": config.data.train_worlds, "search_top_k": config.data.search_top_k,
        "engine": {k: engine[k] for k in ("max_turns", "max_turn_tokens", "max_total_tokens", "temperature")},
        "budget": config.rollout.budget, "pool_size": config.rollout.pool_size,
        "group_size": config.rollout.schemes.group_size, "lr": config.optim.lr,
        "eval_every": config.eval.every, "eval_size": config.eval.size,
    }


# --- Markdown tables of the committed results (for docs/results/*.md) -----------------------------


def _hops_table(name: str, data: dict[str, Any]) -> str:
    """The sample-efficiency table with final accuracy per hop count (issue 13 and later)."""
    methods = data["methods"]
    hops = sorted({h for m in methods.values() for h in m.get("final_accuracy_by_hops", {})}, key=int)
    rows = [[n, fmt(m["final_accuracy_mean"], True), fmt(m["final_accuracy_std"], True),
             *(pm(m.get("final_accuracy_by_hops", {}).get(h)) for h in hops),
             fmt(m.get("train_accuracy_mean"), True), fmt(m.get("redrawn_accuracy_mean"), True),
             fmt(m["effective_ratio_mean"]), fmt(m["tokens_to_grpo_final"]), fmt(m.get("rollouts_to_grpo_final")),
             fmt(m.get("tokens_fraction_of_grpo")), fmt(m.get("tokens_to_90pct_grpo_final"))]
            for n, m in methods.items()]
    setting = data.get("setting", {})
    base = data.get("base_accuracy_by_hops", {})
    base_text = ", ".join(f"{h}-hop {fmt(v, True)}" for h, v in base.items())
    return (title(name, data) + f" ({setting.get('seeds')} seeds x {setting.get('steps')} steps, lr {setting.get('lr')}, "
            f"tiny preset {setting.get('tiny_preset')}, greedy base accuracy {fmt(data.get('base_accuracy'), True)}"
            f"{': ' + base_text if base_text else ''})\n\n" + table(
                ["method", "unseen-world acc", "std", *(f"{h}-hop (mean ± std)" for h in hops), "seen-world acc",
                 "re-drawn facts acc", "effective ratio", "tokens to GRPO final", "rollouts to GRPO final",
                 "fraction of GRPO tokens", "tokens to 90% of GRPO final"], rows))


def _hops(values: dict[str, float] | None) -> str:
    """``a / b / c`` percent per hop count 1, 2, 3 (``-`` where absent)."""
    values = values or {}
    return " / ".join(fmt(values.get(h), True) for h in ("1", "2", "3"))


def _levers_table(data: dict[str, Any]) -> str:
    """One row per lever setting measured by testbed_levers.py (issue 13's choice of setting)."""
    rows = []
    for label, r in data["rows"].items():
        final = r.get("final", {})
        rows.append([label, " ".join(f"`{o}`" for o in r["overrides"]) or "-", str(r.get("eval_questions", "-")),
                     _hops(r["base"]["sampled"]),
                     fmt(r["base"].get("sampled_turns")), _hops(r["base"]["greedy"]),
                     f"{r['method']} {r['steps']}" if r["steps"] else "-", _hops(final.get("by_hops")) if final else "-",
                     fmt(r.get("step_seconds_mean")), fmt(r.get("base_seconds"))])
    return ("**testbed_levers** (unseen world; sampled: 2 episodes per question at the rollout temperature; "
            "per hop count 1 / 2 / 3) [base: each row's model pretrained for it, not recorded]\n\n" + table(
                ["label", "overrides", "questions", "base sampled success", "base turns", "base greedy", "trained",
                 "final greedy accuracy", "s / step", "base eval s"], rows))


def _credit_table(data: dict[str, Any]) -> str:
    """credit_sweep.py's points: accuracy per hop, and each point against GRPO (``w_turn = 0``) seed by seed."""
    rows = []
    for name, m in data["points"].items():
        by_hops = m.get("final_accuracy_by_hops", {})
        paired = m.get("delta_vs_grpo_paired")
        vs = (f"{100 * paired:+.1f} pts, lower in {m['delta_vs_grpo_paired_below']} of {m['paired_seeds_grpo']}"
              if paired is not None and name != data.get("grpo_point") else "-")
        rows.append([name, " ".join(str(s) for s in m.get("seed_list", [])), pm({"mean": m["final_accuracy_mean"],
                     "std": m["final_accuracy_std"]}), *(pm(by_hops.get(h)) for h in ("1", "2", "3")), vs,
                     fmt(m.get("train_accuracy_mean"), True), fmt(m.get("late_tokens_per_step_mean")),
                     fmt(m["effective_ratio_mean"])])
    setting = data.get("setting", {})
    return (title("credit_sweep", data) + f" (`{setting.get('preset')}`, {setting.get('steps')} steps, lr "
            f"{setting.get('lr')}, unseen world; w_turn = 0 is GRPO)\n\n" + table(
                ["point", "seeds", "unseen-world acc", "1-hop", "2-hop", "3-hop", "vs GRPO, same seeds",
                 "seen-world acc", "tokens / step at the end", "effective ratio"], rows))


def base_label(path: Path, data: dict[str, Any], results: Path = RESULTS) -> str:
    """Which base model a results file's figures rest on, for its table's title: the sha256 its
    ``provenance`` records; else a match that ``base_identity.py`` found (its base figures equal the
    shipped base's, ``base_identity.json``); else an earlier pretraining draw that was not recorded."""
    model = (data.get("provenance") or {}).get("base_model") or {}
    if model.get("sha256"):
        source = "shipped" if model.get("source") == "shipped" else str(model.get("source") or "local")
        return f"base: {source} `{model.get('tiny_preset') or model.get('name_or_path')}` {model['sha256'][:8]}"
    identity = results / "base_identity.json"
    if identity.exists():
        known = json.loads(identity.read_text())
        entry = known.get("files", {}).get(path.name, {})
        if entry.get("verdict") == "identified":
            shipped = known["base_models"][entry["setting"]]
            return (f"base: identified as the shipped `{shipped['tiny_preset']}` {shipped['sha256'][:8]} by its base "
                    "figures (`base_identity.json`)")
    return "base: an earlier pretraining draw, not recorded"


def _labelled(part: str, path: Path, data: dict[str, Any], results: Path) -> str:
    """``part`` with :func:`base_label` after its bold title."""
    head, sep, tail = part.partition("\n")
    return f"{head} [{base_label(path, data, results)}]{sep}{tail}"


def markdown_tables(results: Path = RESULTS) -> str:
    """The README tables from whichever result files exist."""
    return "\n\n".join(table_parts(results))


def table_parts(results: Path = RESULTS) -> list[str]:
    """Each README table (its bold title line, blank line, Markdown table) from the result files."""
    parts = []
    path = results / "reference_scoring.json"
    if path.exists():
        data = json.loads(path.read_text())
        rows = [[str(c["cuts"]), str(c["length"]), fmt(c["cached_ratio"]), fmt(c["naive_ratio"])] for c in data["cases"]]
        parts.append(title("reference_scoring", data) + " (time / one forward pass)\n\n"
                     + table(["cuts", "length", "cached", "naive"], rows))
    for path in sorted(results.glob("sample_efficiency*.json")):  # the main sweep, then its variants
        if "shard" in path.stem:  # shards are summarised by their merge
            continue
        data = json.loads(path.read_text())
        if any(m.get("final_accuracy_by_hops") for m in data["methods"].values()):
            parts.append(_labelled(_hops_table(path.stem, data), path, data, results))
            if any(m.get("paired_vs_grpo") for m in data["methods"].values()):
                parts.append(_labelled(protocol_table(path.stem, data), path, data, results))
            if data.get("factorial_2x2"):
                parts.append(_labelled(factorial_table(path.stem, data), path, data, results))
            continue
        rows = [[name, fmt(m["final_accuracy_mean"], True), fmt(m["final_accuracy_std"], True),
                 fmt(m.get("train_accuracy_mean"), True), fmt(m.get("redrawn_accuracy_mean"), True),
                 fmt(m["effective_ratio_mean"]), fmt(m["tokens_to_grpo_final"]),
                 fmt(m.get("tokens_fraction_of_grpo")), fmt(m.get("tokens_to_90pct_grpo_final"))]
                for name, m in data["methods"].items()]
        setting = data.get("setting", {})
        parts.append(_labelled(title(path.stem, data) + f" ({setting.get('seeds')} seeds x {setting.get('steps')} steps, "
                     f"lr {setting.get('lr')}, base accuracy {fmt(data.get('base_accuracy'), True)})\n\n" + table(
            ["method", "unseen-world acc", "std", "seen-world acc", "re-drawn facts acc", "effective ratio",
             "tokens to GRPO final", "fraction of GRPO tokens", "tokens to 90% of GRPO final"], rows), path, data, results))
    path = results / "credit_sweep.json"
    if path.exists():
        data = json.loads(path.read_text())
        parts.append(_labelled(_credit_table(data), path, data, results))
    path = results / "testbed_levers.json"
    if path.exists():
        parts.append(_levers_table(json.loads(path.read_text())))
    path = results / "lr_controls.json"
    if path.exists():
        data = json.loads(path.read_text())
        parts.append(_labelled(lr_controls_table(data), path, data, results))
    for path in sorted(results.glob("allocation_effective_ratio*.json")):
        data = json.loads(path.read_text())
        if "predictor_per_step" not in data:  # the offline predictor-input comparisons have no per-step table
            continue
        setup, world = data["setup"], data["world"]
        auc = {name: (steps["heldout_auc"][0], steps["heldout_auc"][-1]) for name, steps in data["predictor_per_step"].items()}
        rows = [[name, fmt(m["effective_ratio"]), fmt(data["ratio_vs_chain"][name]), fmt(m["success_rate"], True),
                 fmt(m["prompts_per_step"]), " -> ".join(fmt(a) for a in auc[name]) if name in auc else "-"]
                for name, m in data["schemes"].items()]
        parts.append(_labelled(
            f"**{path.stem}** ({data['seeds_done']} seeds x {setup['steps']} steps, budget {setup['budget']}, "
            f"{world['min_hops']}-{world['max_hops']} hops, search top-{setup.get('search_top_k', 3)}, no training)"
            "\n\n" + table(["scheme", "effective ratio", "x chain", "rollout success", "prompts / step",
                              "predictor held-out AUC, step 1 -> last"], rows), path, data, results))
    path = results / "step_overhead.json"
    if path.exists():
        data = json.loads(path.read_text())
        phases = data["phases"]
        rows = [[name, m.get("tree_packing", "-"), *(fmt(m["seconds"].get(p)) for p in phases), fmt(m["step_seconds"]),
                 fmt(m.get("over_grpo")), fmt(m["ms_per_generated_token"]), fmt(m.get("trained_tokens")),
                 fmt(m.get("update_forward_tokens")), fmt(m.get("update_ms_per_trained_token"))]
                for name, m in data["methods"].items()]
        packing = [[preset, fmt(p["update_forward_tokens"]["off"]), fmt(p["update_forward_tokens"]["on"]),
                    fmt(p["trained_tokens"]["on"]), fmt(p["unique_trained_tokens"]), fmt(p["update_seconds"]["off"]),
                    fmt(p["update_seconds"]["on"]), fmt(p["update_off_over_on"]), fmt(p["step_over_grpo"]["off"]),
                    fmt(p["step_over_grpo"]["on"])] for preset, p in data.get("packing", {}).items()]
        parts.append(title("step_overhead", data) + f": trace_over_grpo = {fmt(data['trace_over_grpo'])}, per "
                     f"generated token {fmt(data.get('trace_over_grpo_per_token'))}, scoring + predictor over grpo's "
                     f"step {fmt(data.get('trace_added_phases_over_grpo'))}\n\n"
                     + table(["method", "tree packing", *phases, "step s", "x grpo", "ms / generated token",
                              "trained tokens / step", "tokens forwarded / step", "update ms / trained token"], rows)
                     + ("\n\nTree packing, each preset both ways in the same rounds (medians; `update off/on` is "
                        "the median of the per-round ratio)\n\n" + table(
                            ["preset", "forwarded off", "forwarded on", "trained", "distinct trained", "update s off",
                             "update s on", "update off/on", "step x grpo off", "step x grpo on"], packing)
                        if packing else ""))
    path = results / "tree_savings.json"
    if path.exists():
        data = json.loads(path.read_text())
        rows = [[name, fmt(m["leaves"]), fmt(m["generated_tokens_per_leaf"]), fmt(m["saved_fraction_vs_chain"]),
                 fmt(m["seconds_per_leaf"])] for name, m in data["schemes"].items()]
        parts.append(_labelled(title("tree_savings", data) + "\n\n" + table(
            ["scheme", "leaves", "generated tokens / leaf", "saved vs chain", "s / leaf"], rows), path, data, results))
    path = results / "vs_trl.json"
    if path.exists():
        data = json.loads(path.read_text())
        rows = [[name, fmt(m.get("generation_tokens_per_s")), fmt(m.get("update_tokens_per_s")),
                 fmt(m.get("update_forwarded_tokens_per_s")), fmt(m.get("step_seconds")),
                 fmt(m.get("completion_tokens_mean"))]
                for name, m in data.get("frameworks", {}).items() if "error" not in m]
        errors = [f"{name}: {m['error']}" for name, m in data.get("frameworks", {}).items() if "error" in m]
        parts.append(title("vs_trl", data) + "\n\n" + "\n".join(errors + [""]) + table(
            ["framework", "generated tokens / s", "update: batch tokens / s", "update: forwarded tokens / s", "step s",
             "tokens / completion"], rows))
    return parts


def table_key(block: str) -> str | None:
    """``NAME`` of a block that opens with ``**NAME**`` (``NAME:protocol`` for a protocol table,
    ``NAME:2x2`` for allocation's 2x2)."""
    first = block.split("\n", 1)[0]
    if not first.startswith("**") or "**" not in first[2:]:
        return None
    name = first[2:first.index("**", 2)]
    for suffix, caption in (("protocol", "the comparison protocol"), ("2x2", "allocation's 2x2")):
        if first.startswith(f"**{name}**: {caption}"):
            return f"{name}:{suffix}"
    return name


def _tables(lines: list[str]) -> int:
    """How many Markdown tables (runs of ``|`` lines) ``lines`` hold."""
    return sum(1 for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")))


def _skip_blank(lines: list[str], j: int) -> int:
    while j < len(lines) and not lines[j].strip():
        j += 1
    return j


def _blocks(text: str, tables: dict[str, int]) -> list[tuple[int, int, str]]:
    """``(start, end, key)`` line spans of the tables in ``text`` whose key ``tables`` names: a
    ``**NAME**`` title line, blank lines, the table's ``|`` lines, then, for a block of
    ``tables[key]`` tables, each further one with the single caption line before it."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        key = table_key(lines[i])
        j = _skip_blank(lines, i + 1)
        if key not in tables or j >= len(lines) or not lines[j].startswith("|"):
            i += 1
            continue
        for n in range(tables[key]):
            if n:  # a caption line, then the next table
                caption = _skip_blank(lines, j)
                k = _skip_blank(lines, caption + 1)
                if (caption >= len(lines) or lines[caption].startswith(("|", "#", "**"))
                        or k >= len(lines) or not lines[k].startswith("|")):
                    break
                j = k
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
        out.append((i, j, key))
        i = j
    return out


def splice(text: str, parts: list[str]) -> tuple[str, list[str]]:
    """``text`` with every table that ``parts`` also makes replaced by the fresh one; returns the
    new text and the keys whose table changed. Tables ``parts`` does not make stay as they are."""
    fresh = {table_key(part): part.split("\n") for part in parts}
    counts = {key: _tables(part) for key, part in fresh.items() if key is not None}
    lines, changed = text.split("\n"), []
    for start, end, key in reversed(_blocks(text, counts)):
        if lines[start:end] != fresh[key]:
            lines[start:end] = fresh[key]
            changed.append(key)
    return "\n".join(lines), sorted(changed)


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the results tables of the committed results, or "
                                                 "refresh them in the Markdown pages that hold them.")
    parser.add_argument("--splice", type=Path, nargs="+", metavar="FILE",
                        help="Replace each table the FILEs already hold with the one the results make now.")
    parser.add_argument("--check", type=Path, nargs="+", metavar="FILE",
                        help="Exit 1, naming them, when tables in the FILEs differ from what the results make, "
                             "or when a table the results make is in none of them.")
    args = parser.parse_args()
    if args.splice is None and args.check is None:
        sys.stdout.write(markdown_tables() + "\n")
        return
    parts, stale, placed = table_parts(), False, set()
    for path in args.splice or args.check:
        text = path.read_text(encoding="utf-8")
        new, changed = splice(text, parts)
        placed |= {key for _, _, key in _blocks(new, {table_key(p): _tables(p) for p in parts})}
        if args.splice is not None and changed:
            path.write_text(new, encoding="utf-8")
        verb = "refreshed" if args.splice is not None else "differ from the results"
        print(f"{path}: {len(changed)} table(s) {verb}" + (": " + ", ".join(changed) if changed else ""))
        stale |= bool(changed)
    missing = [key for key in (table_key(p) for p in parts) if key not in placed]
    if missing:  # splice replaces tables in place and never adds one: a new table needs its title line placed
        print("in none of these pages (paste its title line where it belongs, then --splice): " + ", ".join(missing))
    if args.check is not None and (stale or missing):
        sys.exit(1)


if __name__ == "__main__":
    main()
