"""Every committed results JSON records the git commit it was made from and whether the tree was
dirty, except the older files named in ``benchmarks/results/without_commit_record.txt``."""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
LISTED = RESULTS / "without_commit_record.txt"


def records_commit(data: dict) -> bool:
    git = data.get("git")
    return (isinstance(git, dict) and isinstance(git.get("commit"), str)
            and re.fullmatch("[0-9a-f]{40}", git["commit"]) is not None and isinstance(git.get("dirty"), bool))


def test_records_commit_reads_the_git_entry() -> None:
    assert records_commit({"git": {"commit": "a" * 40, "dirty": False}})
    assert not records_commit({"git": {"commit": "a" * 40}})  # no dirty flag
    assert not records_commit({"git": {"commit": None, "dirty": None, "note": "not a checkout"}})
    assert not records_commit({"provenance": {}})


def test_every_results_file_records_its_commit_or_is_listed_as_older() -> None:
    listed = {line for line in LISTED.read_text().splitlines() if line and not line.startswith("#")}
    missing = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json")
               if not records_commit(json.loads(p.read_text()))}
    assert not missing - listed, f"results files with no git commit and dirty flag: {sorted(missing - listed)}"
    assert not listed - missing, f"listed in {LISTED.name} but absent or recording a commit: {sorted(listed - missing)}"
