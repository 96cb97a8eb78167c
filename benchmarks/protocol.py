"""The comparison protocol of the TRACE sweeps: paired differences, bootstrap intervals, collapse.

Every arm trains on the same seeds as GRPO (same initial model, same evaluation questions and
generator seed), so the effect of an arm is read seed by seed: ``arm - grpo`` per seed, its mean
and a percentile bootstrap 95% interval over seeds (:func:`paired_bootstrap`). The endpoint is
held-out *sampled* success per hop count (several samples per question at the rollout
temperature: far less noise per question than one greedy episode) beside greedy accuracy. A run
that collapses (:data:`COLLAPSE_RULE`) is counted per arm; the intervals still use every seed.
sample_efficiency.py writes these into its JSON and ``python benchmarks/common.py`` prints them.
"""

from __future__ import annotations

from typing import Any

from tables import fmt, pm, table, title

COLLAPSE_RULE = ("collapsed: the training reward is 0 on each of the last 10 steps, or the final sampled success "
                 "(all hops) is below half the base model's on the same questions and seed")
"""When a run counts as collapsed (counted per arm apart from the intervals, which use every seed)."""


def collapsed(run: dict[str, Any]) -> bool:
    """:data:`COLLAPSE_RULE` on one run of sample_efficiency.py (``reward_mean`` per step, ``sampled``)."""
    tail = run.get("reward_mean", [])[-10:]
    if len(tail) == 10 and all(r == 0 for r in tail):
        return True
    final, base = (run.get("sampled") or {}).get("all"), (run.get("sampled_base") or {}).get("all")
    return final is not None and base is not None and final < 0.5 * base


def paired_bootstrap(deltas: list[float], resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Mean of per-seed paired differences with a percentile bootstrap 95% interval over seeds.

    ``deltas[i]`` is arm minus baseline on seed i (same seed, same initial model, same questions).
    Returns ``{"mean", "lo", "hi", "n"}``; ``lo``/``hi`` are None for fewer than 2 seeds (one
    difference has no spread to resample). Seeded, so a merge reproduces the committed numbers.
    """
    import numpy as np

    n = len(deltas)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    x = np.asarray(deltas, dtype=float)
    if n < 2:
        return {"mean": float(x.mean()), "lo": None, "hi": None, "n": n}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": n}


def paired_deltas(arm: list[dict[str, Any]], baseline: list[dict[str, Any]], value: Any) -> list[float]:
    """``value(run_arm) - value(run_baseline)`` on every seed both hold where both values exist."""
    base = {r["seed"]: value(r) for r in baseline}
    return [v - base[r["seed"]] for r in arm
            if (v := value(r)) is not None and base.get(r["seed"]) is not None]



def _interval(stats: dict[str, Any] | None) -> str:
    """``+1.2 [-0.5, +3.0] pts`` from :func:`paired_bootstrap` (percent points)."""
    if not stats or stats.get("mean") is None:
        return "-"
    if stats.get("lo") is None:
        return f"{100 * stats['mean']:+.1f} pts (n {stats['n']})"
    return f"{100 * stats['mean']:+.1f} [{100 * stats['lo']:+.1f}, {100 * stats['hi']:+.1f}] (n {stats['n']})"


def protocol_table(name: str, data: dict[str, Any]) -> str:
    """Issue 25's comparison: sampled and greedy success per hop against GRPO, paired by seed."""
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
                     str(m.get("collapses", "-"))])
    setting = data.get("setting", {})
    return (title(name, data) + f": the comparison protocol ({setting.get('sampled_samples')} samples x "
            f"{setting.get('sampled_questions')} unseen-world questions at the rollout temperature; paired "
            f"differences vs GRPO on the same seeds, bootstrap 95% intervals; {COLLAPSE_RULE})\n\n" + table(
                ["method", "seeds", "sampled success", *(f"{h}-hop sampled" for h in hops), "vs GRPO sampled",
                 *(f"vs GRPO {h}-hop" for h in hops), "vs GRPO greedy", "effective ratio", "x GRPO's",
                 "hop share of trained prompts " + " / ".join(hops), "collapses"], rows))
