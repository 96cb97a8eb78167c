"""A shard re-run on another machine set against the committed one: base figures by seed, trained
endpoints against the committed range and as paired differences."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import other_machine  # noqa: E402


def run(seed: int, sampled: float, base: float = 0.05, greedy0: float = 0.16) -> dict:
    return {"seed": seed, "sampled": {"all": sampled, "2": sampled + 0.02, "3": sampled - 0.02},
            "sampled_base": {"all": base}, "final": {"unseen": 0.2},
            "curve": [{"step": 0, "accuracy": greedy0, "accuracy_by_hops": {"2": greedy0}}, {"step": 10, "accuracy": 0.3}]}


def shard(tmp_path: Path, name: str, runs: list[dict], sha: str = "abc") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"runs": {"grpo": runs}, "provenance": {"base_model": {"sha256": sha},
                                                                      "machine": {"cpu": name}}}))
    return path


def test_endpoints_count_the_range_and_pair_by_seed() -> None:
    committed = {0: run(0, 0.10), 1: run(1, 0.12), 2: run(2, 0.08)}
    rerun = {0: run(0, 0.11), 1: run(1, 0.11, base=0.06), 2: run(2, 0.07)}
    got = other_machine.compare(committed, rerun)
    assert got["seeds"] == [0, 1, 2]
    assert got["base_equal_seeds"] == 2 and not got["per_seed"]["1"]["base_equal"]
    e = got["endpoints"]["sampled_all"]
    assert e["committed"]["min"] == 0.08 and e["committed"]["max"] == 0.12
    assert e["rerun_within_committed_range"] == 2  # 0.07 lies below 0.08
    d = e["paired_rerun_minus_committed"]
    # deltas +0.01, -0.01, -0.01: mean -1/300, two lower, one higher
    assert d["mean"] == pytest.approx(-0.01 / 3) and (d["lower"], d["higher"]) == (2, 1)
    assert d["lo"] < d["mean"] < d["hi"]


def test_only_shared_seeds_are_compared() -> None:
    got = other_machine.compare({0: run(0, 0.1), 1: run(1, 0.1)}, {1: run(1, 0.1), 5: run(5, 0.2)})
    assert got["seeds"] == [1] and got["endpoints"]["sampled_all"]["n"] == 1
    with pytest.raises(SystemExit, match="share no seed"):
        other_machine.compare({0: run(0, 0.1)}, {1: run(1, 0.1)})


def test_files_must_hold_the_method_one_base_and_each_seed_once(tmp_path: Path) -> None:
    a = shard(tmp_path, "a.json", [run(0, 0.1)])
    runs, sources = other_machine.runs_by_seed([a, shard(tmp_path, "b.json", [run(1, 0.1)])], "grpo")
    assert sorted(runs) == [0, 1] and [s["machine"]["cpu"] for s in sources] == ["a.json", "b.json"]
    with pytest.raises(SystemExit, match="seed 0"):
        other_machine.runs_by_seed([a, shard(tmp_path, "c.json", [run(0, 0.2)])], "grpo")
    with pytest.raises(SystemExit, match="differs"):
        other_machine.runs_by_seed([a, shard(tmp_path, "d.json", [run(2, 0.1)], sha="other")], "grpo")
    with pytest.raises(SystemExit, match="no runs of method 'dapo'"):
        other_machine.runs_by_seed([a], "dapo")
