"""The comparison protocol of the TRACE sweeps: paired tests by seed, Holm's correction, collapse, escape.

Every arm trains on the same seeds as GRPO (same initial model, same evaluation questions and
generator seed), so the effect of an arm is read seed by seed: ``arm - grpo`` per seed. Per metric
(:func:`paired_stats`): the mean difference with its 95% t-interval and two-sided paired t-test
p-value, the exact sign-flip p-value of the mean (no normality assumed), and a percentile
bootstrap interval only from :data:`stats.BOOTSTRAP_MIN_N` seeds on. :func:`add_holm` adjusts the
t-test p-values over the arms of one table, per metric, and reads each arm as :func:`decide` does
(the rule the look-alike credit test registered before it ran). The endpoint is held-out *sampled* success
per hop count (several samples per question at the rollout temperature) beside greedy accuracy; the
questions are one draw of the unseen world's test split, so each hop count has its own number of
them (``questions_per_hop`` in the JSON). A run that collapses (:data:`COLLAPSE_RULE`) or escapes
the all-fail regime (:data:`ESCAPE_RULE`) is counted per arm, with a Wilson interval for the
escape probability; the intervals still use every seed. sample_efficiency.py writes these into its
JSON and ``python benchmarks/common.py`` prints them.
"""

from __future__ import annotations

import statistics
from typing import Any

from stats import BOOTSTRAP_MIN_N, holm, holm_thresholds, paired_bootstrap, paired_t, sign_flip, wilson
from tables import fmt, pm, table, title

COLLAPSE_RULE = ("collapsed: the training reward is 0 on each of the last 10 steps, or the final sampled success "
                 "(all hops) is below half the base model's on the same questions and seed")
"""When a run counts as collapsed (counted per arm apart from the intervals, which use every seed)."""
ESCAPE_MARGIN = 0.02
ESCAPE_WINDOW = 10
ESCAPE_RULE = ("escaped: the final sampled success (all hops) is at least the base model's on the same questions "
               "and seed plus 2 points; time to escape: the first step at which the training reward, averaged "
               "over that step and the 9 before it, reaches the same level (base + 2 points)")
"""When a run has left the all-fail regime, and when. Two points absolute: on the credit testbed
(base about 0.5%, 1,200 sampled episodes) that is about ten binomial standard errors above the
base, and no GRPO run there reached it; it is the pre-registered precondition's margin."""


def collapsed(run: dict[str, Any]) -> bool:
    """:data:`COLLAPSE_RULE` on one run of sample_efficiency.py (``reward_mean`` per step, ``sampled``)."""
    tail = run.get("reward_mean", [])[-10:]
    if len(tail) == 10 and all(r == 0 for r in tail):
        return True
    final, base = _sampled_all(run)
    return final is not None and base is not None and final < 0.5 * base


def _sampled_all(run: dict[str, Any]) -> tuple[float | None, float | None]:
    return (run.get("sampled") or {}).get("all"), (run.get("sampled_base") or {}).get("all")


def escaped(run: dict[str, Any]) -> bool | None:
    """:data:`ESCAPE_RULE` on one run; None without a sampled endpoint before and after training."""
    final, base = _sampled_all(run)
    return None if final is None or base is None else final >= base + ESCAPE_MARGIN - 1e-9


def time_to_escape(run: dict[str, Any]) -> int | None:
    """The first step (1-based) whose trailing :data:`ESCAPE_WINDOW`-step mean training reward
    reaches the base sampled success + :data:`ESCAPE_MARGIN`; None if never (or no base)."""
    rewards, base = run.get("reward_mean", []), _sampled_all(run)[1]
    if base is None:
        return None
    for end in range(ESCAPE_WINDOW, len(rewards) + 1):
        if statistics.fmean(rewards[end - ESCAPE_WINDOW:end]) >= base + ESCAPE_MARGIN - 1e-9:
            return end
    return None


def escape_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Escapes of one arm: ``{"count", "n", "probability", "lo", "hi", "timed", "median_step", "rule"}``
    (Wilson 95% interval; ``median_step`` over the ``timed`` runs whose training reward crossed)."""
    verdicts = [v for v in map(escaped, runs) if v is not None]
    steps = [s for s in map(time_to_escape, runs) if s is not None]
    interval = wilson(sum(verdicts), len(verdicts))
    return {"count": sum(verdicts), "n": len(verdicts), "probability": sum(verdicts) / len(verdicts) if verdicts else None,
            "lo": interval[0] if interval else None, "hi": interval[1] if interval else None,
            "timed": len(steps), "median_step": statistics.median(steps) if steps else None, "rule": ESCAPE_RULE}


def paired_deltas(arm: list[dict[str, Any]], baseline: list[dict[str, Any]], value: Any) -> list[float]:
    """``value(run_arm) - value(run_baseline)`` on every seed both hold where both values exist."""
    base = {r["seed"]: value(r) for r in baseline}
    return [v - base[r["seed"]] for r in arm
            if (v := value(r)) is not None and base.get(r["seed"]) is not None]


def paired_stats(deltas: list[float]) -> dict[str, Any]:
    """Every test of one metric's per-seed differences (shape (n,)).

    ``{"mean", "sd", "lo", "hi", "p_t", "n"}`` from :func:`stats.paired_t` (``lo``/``hi``: the 95%
    t-interval), ``p_signflip`` (None below 2 seeds), ``p_holm`` (None until :func:`add_holm`),
    ``bootstrap_lo``/``bootstrap_hi`` from :data:`BOOTSTRAP_MIN_N` seeds on, else None with
    ``bootstrap_note`` saying why.
    """
    out = {**paired_t(deltas), "p_signflip": sign_flip(deltas) if len(deltas) >= 2 else None, "p_holm": None}
    if len(deltas) >= BOOTSTRAP_MIN_N:
        boot = paired_bootstrap(deltas)
        return {**out, "bootstrap_lo": boot["lo"], "bootstrap_hi": boot["hi"], "bootstrap_note": None}
    return {**out, "bootstrap_lo": None, "bootstrap_hi": None,
            "bootstrap_note": f"{len(deltas)} seeds < {BOOTSTRAP_MIN_N}: a percentile bootstrap over so few seeds "
                              "is narrower than the t-interval; not reported"}


MECHANISM_2X2 = {"learned roots": ("trace_alloc", "trace_alloc_notree", "trace_alloc_ul", "grpo"),
                 "tree": ("trace_alloc", "trace_alloc_ul", "trace_alloc_notree", "grpo")}
"""Allocation's 2x2 (tree on/off x learned root allocation on/off) as each factor's four cells:
(both on, only this factor on, only the other on, neither), so the factor's effect at each level of
the other is ``cells[0] - cells[2]`` and ``cells[1] - cells[3]``."""
MECHANISM_PAIRS = {"learned roots without the tree minus GRPO on two-hop prompts only": ("trace_alloc_notree", "grpo_twohop")}
"""Paired contrasts read beside the 2x2 (``arm - other`` by seed), where both arms ran: whether
learned roots do more than the two-hop curriculum they end up training (stage 1 picks two-hop
prompts on the credit testbed)."""


def factorial_2x2(runs: dict[str, list[dict[str, Any]]], value: Any,
                  design: dict[str, tuple[str, str, str, str]] = MECHANISM_2X2,
                  pairs: dict[str, tuple[str, str]] = MECHANISM_PAIRS) -> dict[str, Any] | None:
    """Main effects and interaction of a 2x2 of arms, paired by seed (None unless every cell has runs).

    Per seed that every cell holds (``value`` not None), a factor's main effect is the mean of its
    two simple effects, ``((on_on - off_on) + (on_off - off_off)) / 2``, and the interaction is
    their difference ``(on_on - off_on) - (on_off - off_off)`` (the same for either factor); each
    goes through :func:`paired_stats`; so does each of ``pairs`` whose two arms ran. These contrasts
    are read beside the table's comparisons with GRPO, not added to its Holm family.
    """
    arms = {arm for cells in design.values() for arm in cells}
    if any(not runs.get(arm) for arm in arms):
        return None
    by_seed = {arm: {r["seed"]: value(r) for r in runs[arm]} for arm in arms}
    seeds = sorted(set.intersection(*({s for s, v in values.items() if v is not None} for values in by_seed.values())))
    out: dict[str, Any] = {}
    for factor, (on_on, on_off, off_on, off_off) in design.items():
        simple = [(by_seed[on_on][s] - by_seed[off_on][s], by_seed[on_off][s] - by_seed[off_off][s]) for s in seeds]
        out[factor] = paired_stats([(a + b) / 2 for a, b in simple])
    on_on, on_off, off_on, off_off = next(iter(design.values()))  # the same difference of differences for either factor
    out["interaction"] = paired_stats([(by_seed[on_on][s] - by_seed[off_on][s]) - (by_seed[on_off][s] - by_seed[off_off][s])
                                       for s in seeds])
    for label, (arm, other) in pairs.items():
        if runs.get(arm) and runs.get(other):
            out[label] = paired_stats(paired_deltas(runs[arm], runs[other], value))
    return out


ALPHA = 0.05
"""The family-wise error rate of one table's comparisons with GRPO, per metric."""


def decide(mean: float | None, p_holm: float | None, p_signflip: float | None, step: float | None,
           alpha: float = ALPHA) -> str:
    """The pre-registered reading of one arm's paired differences: ``higher`` or ``lower`` than
    GRPO when the t-test passes Holm's procedure (``p_holm <= alpha``) and the sign-flip p-value is
    at most the same step of it (``step``: alpha / (m - rank), :func:`stats.holm_thresholds`);
    otherwise ``unresolved`` (at this number of seeds)."""
    if mean is None or p_holm is None or p_signflip is None or step is None or mean == 0:
        return "unresolved"
    if p_holm <= alpha and p_signflip <= step:
        return "higher" if mean > 0 else "lower"
    return "unresolved"


def add_holm(methods: dict[str, dict[str, Any]], baseline: str = "grpo", alpha: float = ALPHA) -> None:
    """Set ``p_holm`` and ``decision`` (:func:`decide`) of every arm's ``paired_vs_grpo[metric]``:
    Holm over the arms of one table (the baseline excluded), per metric, on the t-test p-values.
    Changes ``methods`` in place."""
    arms = [m for name, m in methods.items() if name != baseline and m.get("paired_vs_grpo")]
    for metric in sorted({k for m in arms for k in m["paired_vs_grpo"]}):
        cells = [m["paired_vs_grpo"][metric] for m in arms if metric in m["paired_vs_grpo"]]
        pvalues = [c.get("p_t") for c in cells]
        for cell, p, step in zip(cells, holm(pvalues), holm_thresholds(pvalues, alpha), strict=True):
            cell["p_holm"] = p
            cell["decision"] = decide(cell.get("mean"), p, cell.get("p_signflip"), step, alpha)


def _p(value: float | None) -> str:
    return "-" if value is None else (f"{value:.2g}" if value >= 0.001 else "<0.001")


def _interval(stats: dict[str, Any] | None) -> str:
    """``+1.2 [-0.5, +3.0] (n 7; Holm p 0.04, sign-flip p 0.03)`` in percent points: the t-interval,
    then the bootstrap interval where it is reported."""
    if not stats or stats.get("mean") is None:
        return "-"
    if stats.get("lo") is None:
        return _span(stats)
    boot = (f"; bootstrap [{100 * stats['bootstrap_lo']:+.1f}, {100 * stats['bootstrap_hi']:+.1f}]"
            if stats.get("bootstrap_lo") is not None else "")
    tests = [f"Holm p {_p(stats['p_holm'])}"] if stats.get("p_holm") is not None else []
    if tests or (stats.get("sd") == 0 and stats["mean"] != 0):  # equal differences: no t-test, the sign flip
        tests.append(f"sign-flip p {_p(stats.get('p_signflip'))}")
    tests_text = "; " + ", ".join(tests) if tests else ""
    return f"{_span(stats)} (n {stats['n']}{tests_text}{boot})"


def _span(stats: dict[str, Any]) -> str:
    """``+1.2 [-0.5, +3.0]`` in percent points, or ``+1.2 pts (n 1)`` without an interval."""
    if stats.get("lo") is None:
        return f"{100 * stats['mean']:+.1f} pts (n {stats['n']})"
    return f"{100 * stats['mean']:+.1f} [{100 * stats['lo']:+.1f}, {100 * stats['hi']:+.1f}]"


def _escape(m: dict[str, Any]) -> str:
    e = m.get("escape")
    if not e or not e.get("n"):
        return "-"
    step = f", median step {e['median_step']:g}" if e.get("median_step") is not None else ""
    return f"{e['count']}/{e['n']} ({100 * e['lo']:.0f}-{100 * e['hi']:.0f}%{step})"


def _questions(data: dict[str, Any]) -> str:
    per_hop = (data.get("questions_per_hop") or {}).get("sampled") or {}
    return " (" + ", ".join(f"{h}-hop {n}" for h, n in per_hop.items()) + ")" if per_hop else ""


def protocol_table(name: str, data: dict[str, Any]) -> str:
    """The comparison: sampled and greedy success per hop against GRPO, paired by seed, and escapes."""
    methods = data["methods"]
    hops = sorted({h for m in methods.values() for h in m.get("sampled_by_hops", {}) if h != "all"}, key=int)
    rows = []
    for n, m in methods.items():
        paired = m.get("paired_vs_grpo", {})
        rows.append([n, str(m.get("seeds")), pm(m.get("sampled_by_hops", {}).get("all")),
                     *(pm(m.get("sampled_by_hops", {}).get(h)) for h in hops),
                     _interval(paired.get("sampled_all")), *(_interval(paired.get(f"sampled_{h}")) for h in hops),
                     _interval(paired.get("greedy_all")), fmt(m.get("effective_ratio_mean")),
                     fmt(m.get("effective_ratio_vs_grpo")),
                     " / ".join(fmt(m.get("hop_share_mean", {}).get(h), True) for h in hops) or "-",
                     str(m.get("collapses", "-")), _escape(m)])
    setting = data.get("setting", {})
    return (title(name, data) + f": the comparison protocol ({setting.get('sampled_samples')} samples x "
            f"{setting.get('sampled_questions')} unseen-world questions{_questions(data)} at the rollout temperature; "
            "paired differences vs GRPO on the same seeds with 95% t-intervals, Holm-adjusted t-test and sign-flip "
            f"p-values, bootstrap intervals from {BOOTSTRAP_MIN_N} seeds; {COLLAPSE_RULE}; {ESCAPE_RULE}, "
            "with a Wilson 95% interval)\n\n" + table(
                ["method", "seeds", "sampled success", *(f"{h}-hop sampled" for h in hops), "vs GRPO sampled",
                 *(f"vs GRPO {h}-hop" for h in hops), "vs GRPO greedy", "effective ratio", "x GRPO's",
                 "hop share of trained prompts " + " / ".join(hops), "collapses", "escaped"], rows))


def _contrast(stats: dict[str, Any] | None) -> str:
    """``+3.6 [+1.0, +6.2] (n 7; t-test p 0.012, sign-flip p 0.031)`` in percent points (no Holm)."""
    if not stats or stats.get("mean") is None:
        return "-"
    if stats.get("lo") is None:
        return _span(stats)
    return f"{_span(stats)} (n {stats['n']}; t-test p {_p(stats.get('p_t'))}, sign-flip p {_p(stats.get('p_signflip'))})"


def factorial_table(name: str, data: dict[str, Any]) -> str:
    """Allocation's 2x2 (:func:`factorial_2x2`): each factor's main effect and their interaction on sampled success."""
    factorial = data["factorial_2x2"]
    metrics = [k for k, v in factorial.items() if v]
    labels = {"learned roots": "learned root allocation (main effect)", "tree": "tree (main effect)",
              "interaction": "interaction (roots' effect with the tree minus without)"}
    rows = [[labels.get(effect, effect), *(_contrast(factorial[k].get(effect)) for k in metrics)]
            for effect in factorial[metrics[0]]]
    heads = ["sampled success" if k == "sampled_all" else f"{k.removeprefix('sampled_')}-hop sampled" for k in metrics]
    return (title(name, data) + ": allocation's 2x2 (tree on/off x learned root allocation on/off: `trace_alloc`, "
            "`trace_alloc_ul`, `trace_alloc_notree`, `grpo`), paired by seed; a main effect is the mean of the "
            "factor's effects at both levels of the other; below them, arm-minus-arm contrasts by seed; 95% t-intervals, "
            "t-test and sign-flip p-values, not in the table's Holm family\n\n" + table(["effect", *heads], rows))
