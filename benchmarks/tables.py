"""Markdown table helpers of the benchmark reports: cells, ``mean ± std``, the table and its title.

Shared by ``common.py`` (:func:`markdown_tables`, what ``python benchmarks/common.py`` prints) and
``protocol.py`` (the comparison-protocol table), which imports nothing of ``common.py``.
"""

from __future__ import annotations

from typing import Any


def fmt(value: Any, pct: bool = False) -> str:
    """One cell: ``-`` for None, a float as a percent (``pct``) or 3 significant digits, an int with commas."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if pct else (f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}")
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of ``rows`` under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def title(name: str, data: dict[str, Any]) -> str:
    """The bold name a table is introduced with, marking a ``--quick`` run."""
    return f"**{name}**" + (" (`--quick` run)" if data.get("quick") else "")


def pm(stats: dict[str, Any] | None) -> str:
    """``mean ± std`` of a per-hop summary (percent)."""
    if not stats or stats.get("mean") is None:
        return "-"
    spread = f" ± {100 * stats['std']:.1f}" if stats.get("std") is not None else ""
    return f"{100 * stats['mean']:.1f}{spread}%"


def _p_value(value: float | None) -> str:
    return "-" if value is None else (f"{value:.2g}" if value >= 0.001 else "<0.001")


def paired_cell(stats: dict[str, Any] | None) -> str:
    """``+5.3 [+4.0, +6.6] (n 7; Holm p 0.001, sign-flip p 0.016)`` in percent points; without an
    interval (one seed) ``+5.3 pts (n 1)``."""
    if not stats or stats.get("mean") is None:
        return "-"
    if stats.get("lo") is None:
        return f"{100 * stats['mean']:+.1f} pts (n {stats['n']})"
    tests = ", ".join(f"{name} p {_p_value(stats.get(key))}" for name, key in (("Holm", "p_holm"), ("sign-flip", "p_signflip"))
                      if stats.get(key) is not None)
    return (f"{100 * stats['mean']:+.1f} [{100 * stats['lo']:+.1f}, {100 * stats['hi']:+.1f}] (n {stats['n']}"
            + (f"; {tests})" if tests else ")"))


def escape_cell(escape: dict[str, Any] | None) -> str:
    """``5/7 (36-92%, median step 77)``: runs that escaped the all-fail regime, Wilson 95% interval."""
    if not escape or not escape.get("n"):
        return "-"
    step = f", median step {escape['median_step']:g}" if escape.get("median_step") is not None else ""
    return f"{escape['count']}/{escape['n']} ({100 * escape['lo']:.0f}-{100 * escape['hi']:.0f}%{step})"


def lr_controls_table(data: dict[str, Any]) -> str:
    """lr_controls.py's two tables: each arm on the paired seeds, then the paired comparisons (Holm over them)."""
    metrics = {"sampled_all": "sampled success", "sampled_2": "2-hop sampled", "sampled_3": "3-hop sampled",
               "greedy_all": "greedy"}
    arms = [[name, f"{m['lr']:g}", str(m["seeds"]), *(pm(m.get(k)) for k in metrics), escape_cell(m.get("escape"))]
            for name, m in data["arms"].items()]
    comparisons = [[label, *(paired_cell(c.get(k)) for k in metrics)] for label, c in data["comparisons"].items()]
    setting = data.get("setting", {})
    per_hop = (data.get("questions_per_hop") or {}).get("sampled") or {}
    hops = ", ".join(f"{h}-hop {n}" for h, n in per_hop.items())
    return (title("lr_controls", data) + f": learned roots without the tree and GRPO at lr 3e-4 against GRPO and "
            f"GRPO two-hop-only at lr 1e-3 on the credit testbed, on the {data['n']} seeds both shard sets hold "
            f"({', '.join(str(s) for s in data['seeds'])}; {setting.get('steps')} steps; {setting.get('sampled_samples')} "
            f"samples x {setting.get('sampled_questions')} unseen-world questions{f' ({hops})' if hops else ''} at the "
            "rollout temperature; greedy on the unseen world; escaped: final sampled success at least the seed's base "
            "plus 2 points, Wilson 95% interval)\n\n"
            + table(["arm", "lr", "seeds", *metrics.values(), "escaped"], arms)
            + "\n\nPaired differences by seed in percent points: 95% t-interval, Holm over the three comparisons per "
              "metric (t-test), exact sign-flip p\n\n"
            + table(["comparison", *metrics.values()], comparisons))
