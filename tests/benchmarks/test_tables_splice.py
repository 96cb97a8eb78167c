"""The results tables are refreshed in place from the results JSONs, and the committed pages are current."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TEXT = """# Results

Prose before.

**alpha** (2 seeds)

| a | b |
|---|---|
| 1 | 2 |

**beta**: the comparison protocol (rule)

| x |
|---|
| old |

Caption of beta's second table

| y |
|---|
| old |

A hand-made table stays as it is:

| h |
|---|
| 9 |
"""


def test_splice_replaces_stale_tables_and_keeps_the_rest() -> None:
    parts = ["**alpha** (2 seeds)\n\n| a | b |\n|---|---|\n| 1 | 2 |",  # unchanged
             "**beta**: the comparison protocol (rule)\n\n| x |\n|---|\n| new |\n\nCaption of beta's second table"
             "\n\n| y |\n|---|\n| new |",
             "**gamma**\n\n| g |\n|---|\n| 1 |"]  # not in the text: not added
    new, changed = common.splice(TEXT, parts)
    assert changed == ["beta:protocol"]
    assert new.count("| new |") == 2 and "| old |" not in new
    assert "**gamma**" not in new and "| 9 |" in new and "Prose before." in new
    assert new.count("Caption of beta's second table") == 1
    assert common.splice(new, parts) == (new, [])  # idempotent


def test_table_keys() -> None:
    assert common.table_key("**sample_efficiency** (5 seeds)") == "sample_efficiency"
    assert common.table_key("**x**: the comparison protocol (...) [base: ...]") == "x:protocol"
    assert common.table_key("**x**: allocation's 2x2 (tree on/off ...) [base: ...]") == "x:2x2"  # beside x and x:protocol
    assert common.table_key("plain line") is None and common.table_key("**unclosed") is None


def test_committed_tables_are_what_the_committed_results_make() -> None:
    """A results JSON changed without `python benchmarks/common.py --splice docs/results/*.md`
    leaves a stale table in the docs' results pages: this names it."""
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        assert common.splice(page.read_text(encoding="utf-8"), common.table_parts())[1] == [], page.name


def test_every_table_the_results_make_is_on_one_results_page() -> None:
    """Splicing only replaces tables in place, so a table no page holds would silently go unshown."""
    parts = common.table_parts()
    counts = {common.table_key(p): common._tables(p) for p in parts}
    placed = [key for page in sorted((ROOT / "docs" / "results").glob("*.md"))
              for _, _, key in common._blocks(page.read_text(encoding="utf-8"), counts)]
    assert sorted(placed) == sorted(counts)  # each once: none missing, none shown twice
