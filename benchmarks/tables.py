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
